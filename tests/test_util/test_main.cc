// The main of every test executable: registers the CPU backend for ops/, then runs the tests.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"

int main(int argc, char** argv) {
  tessera::cpu::register_backend();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
