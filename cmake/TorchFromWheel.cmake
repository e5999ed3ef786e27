# The libtorch inside the pip-installed torch wheel, as an imported target for the PyTorch AOT library.
#
#   import_torch_from_wheel(<target>)   defines <target> (headers, libraries, ABI and per-operator-header defines, C++20); sets
#                                       TORCH_WHEEL_CUDA_VERSION ("" for a CPU build of torch)
#   enable_cuda_kernels(<out_var>)      sets <out_var> to ON when torch has CUDA and a CUDA compiler is found
#                                       (CUSTOM_OPS_CUDA=AUTO), after enabling the CUDA language; says why otherwise.
#                                       CUSTOM_OPS_CUDA=CHECK sets it to CHECK: compile the CUDA sources, link nothing
#                                       (a CI check for machines with nvcc but a CPU build of torch)
#   add_torch_cuda_sources(<target> <.cu>...)   compiles CUDA sources into <target> the way cpp_extension would
#   add_torch_cuda_check(<target> <.cu>...)     an object library that only compiles them, with the same flags
#
# Not find_package(Torch): with a CUDA build of torch it requires the CUDA toolkit even to build CPU code, and aborts
# configure where pip users usually have none.

function(import_torch_from_wheel target)
  # Read from the installed files, not `import torch` (1.8 s of CPU per configure, and the test suite configures ~50
  # trees): the C++ ABI from libc10's mangled names (std::__cxx11 appears only in a new-ABI build), the CUDA version
  # from torch/version.py, which imports nothing of torch.
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c [=[
import importlib.util, os
root = list(importlib.util.find_spec("torch").submodule_search_locations)[0]
print(os.path.join(root, "include"), os.path.join(root, "include", "torch", "csrc", "api", "include"), sep=";")
print(os.path.join(root, "lib"))
with open(os.path.join(root, "lib", "libc10.so"), "rb") as f:
    print(int(b"St7__cxx11" in f.read()))
version = {}
with open(os.path.join(root, "version.py")) as f:
    exec(f.read(), version)
print(version["cuda"] or "")
]=]
    OUTPUT_VARIABLE probe
    ERROR_VARIABLE error
    RESULT_VARIABLE status
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "Cannot find torch for ${Python3_EXECUTABLE}; install the pins from pyproject.toml "
                        "(bash test_custom_ops.sh does it into .venv/).\n${error}")
  endif()
  string(REPLACE "\n" ";" probe "${probe}")
  list(GET probe 0 include_dir)
  list(GET probe 1 api_include_dir)
  list(GET probe 2 lib_dir)
  list(GET probe 3 cxx11_abi)
  list(LENGTH probe fields)
  set(cuda_version "")
  if(fields GREATER 4)
    list(GET probe 4 cuda_version)
  endif()

  set(libraries)
  foreach(name c10 torch_cpu torch)
    find_library(torch_wheel_${name} ${name} PATHS "${lib_dir}" NO_DEFAULT_PATH REQUIRED)
    list(APPEND libraries "${torch_wheel_${name}}")
  endforeach()

  add_library(${target} INTERFACE IMPORTED)
  target_include_directories(${target} SYSTEM INTERFACE "${include_dir}" "${api_include_dir}")
  target_link_libraries(${target} INTERFACE ${libraries})
  # AT_PER_OPERATOR_HEADERS: ATen headers include each op's declarations only when asked (ATen/ops/<op>.h), not all
  # of them (ATen/native/Resize.h alone pulled in NativeFunctions.h): a third off each ATen-mode compile.
  target_compile_definitions(${target} INTERFACE _GLIBCXX_USE_CXX11_ABI=${cxx11_abi} AT_PER_OPERATOR_HEADERS)
  # torch 2.13's headers need C++20, as its cpp_extension compiles (-std=c++20): CMake and JIT builds agree.
  target_compile_features(${target} INTERFACE cxx_std_20)
  set_target_properties(${target} PROPERTIES INTERFACE_LINK_DIRECTORIES "${lib_dir}")
  set(TORCH_WHEEL_LIB_DIR "${lib_dir}" PARENT_SCOPE)
  set(TORCH_WHEEL_CUDA_VERSION "${cuda_version}" PARENT_SCOPE)
endfunction()

# A macro: enable_language() must run at file scope, not inside a function.
macro(enable_cuda_kernels out_var)
  set(CUSTOM_OPS_CUDA "AUTO" CACHE STRING
      "CUDA kernels: AUTO (built when torch and a CUDA compiler have CUDA), ON (required), OFF, CHECK (compile only)")
  set_property(CACHE CUSTOM_OPS_CUDA PROPERTY STRINGS AUTO ON OFF CHECK)
  set(${out_var} OFF)
  set(_cuda_skip_reason "")
  if(CUSTOM_OPS_CUDA STREQUAL "OFF")
    set(_cuda_skip_reason "CUSTOM_OPS_CUDA=OFF")
  elseif(CUSTOM_OPS_CUDA STREQUAL "CHECK")
    include(CheckLanguage)
    check_language(CUDA)
    if(NOT CMAKE_CUDA_COMPILER)
      message(FATAL_ERROR "CUSTOM_OPS_CUDA=CHECK needs a CUDA compiler (nvcc) on PATH or in CMAKE_CUDA_COMPILER")
    endif()
  elseif(NOT TORCH_WHEEL_CUDA_VERSION)
    set(_cuda_skip_reason "the torch in use is a CPU build")
  else()
    include(CheckLanguage)
    check_language(CUDA)
    if(NOT CMAKE_CUDA_COMPILER)
      set(_cuda_skip_reason "torch has CUDA ${TORCH_WHEEL_CUDA_VERSION} but no CUDA compiler (nvcc) was found; install "
                            "the CUDA toolkit or set CMAKE_CUDA_COMPILER")
    endif()
  endif()
  if(_cuda_skip_reason AND CUSTOM_OPS_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CUSTOM_OPS_CUDA=ON, but ${_cuda_skip_reason}")
  elseif(_cuda_skip_reason)
    message(STATUS "CUDA kernels: skipped (${_cuda_skip_reason}); the CPU kernels are built")
  else()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND CUSTOM_OPS_CUDA STREQUAL "CHECK")
      set(CMAKE_CUDA_ARCHITECTURES "80-real" CACHE STRING "CUDA architectures")  # one is enough to check the source
    elseif(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Volta to Hopper, plus PTX for newer GPUs; -DCMAKE_CUDA_ARCHITECTURES=native builds for this machine's GPU.
      set(CMAKE_CUDA_ARCHITECTURES "70-real;80-real;90-real;90-virtual" CACHE STRING "CUDA architectures")
    endif()
    enable_language(CUDA)
    if(CUSTOM_OPS_CUDA STREQUAL "CHECK")
      message(STATUS "CUDA kernels: compiled only (CUSTOM_OPS_CUDA=CHECK) with ${CMAKE_CUDA_COMPILER}")
      set(${out_var} CHECK)
    else()
      find_package(CUDAToolkit REQUIRED)
      message(STATUS "CUDA kernels: built for ${CMAKE_CUDA_ARCHITECTURES} with ${CMAKE_CUDA_COMPILER}")
      set(${out_var} ON)
    endif()
  endif()
endmacro()

# Adds CUDA sources to a target that links the torch target: C++20 like the host side, the flags torch's
# cpp_extension passes to nvcc, and torch's CUDA libraries.
function(set_torch_cuda_flags target)
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
                               -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__>)
endfunction()

function(add_torch_cuda_sources target)
  target_sources(${target} PRIVATE ${ARGN})
  set_torch_cuda_flags(${target})
  foreach(name c10_cuda torch_cuda)
    find_library(torch_wheel_${name} ${name} PATHS "${TORCH_WHEEL_LIB_DIR}" NO_DEFAULT_PATH REQUIRED)
    target_link_libraries(${target} PRIVATE "${torch_wheel_${name}}")
  endforeach()
  target_link_libraries(${target} PRIVATE CUDA::cudart)
endfunction()

function(add_torch_cuda_check target)
  add_library(${target} OBJECT ${ARGN})
  target_link_libraries(${target} PRIVATE torch_from_wheel)
  set_torch_cuda_flags(${target})
  # A CPU build of torch ships c10/cuda headers but not the one CMake generates for CUDA builds; its macros only
  # matter for Windows DLL exports.
  target_compile_definitions(${target} PRIVATE C10_CUDA_NO_CMAKE_CONFIGURE_FILE)
endfunction()
