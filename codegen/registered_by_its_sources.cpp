// Linked into a kernel library none of whose ops codegen registers (each kernel source registers its own op with
// EXECUTORCH_LIBRARY): the marker a runner reads (runner/program_runner.cpp), which codegen's registration defines
// otherwise (codegen/templates/). Present, the library's objects are linked in and their initializers have run.
extern "C" {
__attribute__((visibility("default"))) int custom_ops_kernels_registered = 1;
}
