// Catch2 main for the torch-free test suites.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
