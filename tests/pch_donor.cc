// Builds the precompiled header the test binaries share (cmake/loom.cmake);
// not a test itself.
int main() { return 0; }
