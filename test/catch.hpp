// Catch2 shim: the tests are written against v2 (Debian 12 ships 2.13) and also build with v3.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
