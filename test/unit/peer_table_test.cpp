#include "../catch.hpp"
