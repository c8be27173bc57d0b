// The Catch2 test runner: every tests/test_*.cpp links into this one executable.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
