// Builds a precompiled header that other targets share (cmake/loom.cmake:
// loom_library_pch, loom_test_pch); not a program of its own.
int main() { return 0; }
