// Included before anything else in every unit of the library (meson.build: -include).
//
// Asio is header-only: the library and the program each compile its code, and the two copies
// must share Asio's objects: the thread's call stack (which Asio's handler recycling, strand
// dispatch and the scheduler's thread-private queue read), its error categories (error codes
// compare categories by address: asio::error::operation_aborted from the library must equal the
// program's) and executors' function tables (which any_io_executor's == compares by address).
// So the headers that declare them keep default visibility, declared here before anything else
// can, while the library's own code is hidden; lib/libdma-libfabric.map exports those objects
// alone, and the program's copies are the ones both bind to.
#pragma once

#pragma GCC visibility push(default)
#include <dma/config.hpp>  // first: a standard header, then what Asio must be told before it starts

#include <asio/any_io_executor.hpp>
#include <asio/detail/call_stack.hpp>
#include <asio/detail/strand_executor_service.hpp>
#include <asio/detail/thread_context.hpp>
#include <asio/detail/thread_info_base.hpp>
#include <asio/error.hpp>
#pragma GCC visibility pop
