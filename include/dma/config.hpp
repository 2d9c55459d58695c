/// @file
/// Version guards and toolchain adaptations live here and nowhere else.
#pragma once

// clang 14 with libstdc++: Asio 1.22 only looks for <experimental/coroutine> under clang, so
// awaitables vanish unless we tell it that standard coroutines are there.
#if defined(__clang__) && !defined(ASIO_HAS_CO_AWAIT) && __has_include(<coroutine>)
#if defined(ASIO_DETAIL_CONFIG_HPP)
#error "Include a <dma/...> header before any Asio header, or define ASIO_HAS_CO_AWAIT=1 and ASIO_HAS_STD_COROUTINE=1"
#endif
#include <coroutine>
#define ASIO_HAS_CO_AWAIT 1
#define ASIO_HAS_STD_COROUTINE 1
#endif

#include <asio/version.hpp>

#if ASIO_VERSION < 102200
#error "dma-libfabric needs Asio 1.22 or newer"
#endif

// Asio 1.22 keeps deferred and as_tuple under experimental; later releases promote them.
#if ASIO_VERSION < 102400
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/deferred.hpp>
namespace dma::compat {
using asio::experimental::as_tuple;
using asio::experimental::as_tuple_t;
using asio::experimental::deferred;
}  // namespace dma::compat
#else
#include <asio/as_tuple.hpp>
#include <asio/deferred.hpp>
namespace dma::compat {
using asio::as_tuple;
using asio::as_tuple_t;
using asio::deferred;
}  // namespace dma::compat
#endif
