# Selective build and kernel-binding codegen, through the project's one codegen entry point (codegen/run_codegen.py),
# which wraps the tools the executorch wheel ships (gen_oplist, executorch.codegen.gen) with this project's templates.
#
#   plan_custom_ops([ROOT_OPS <op;op...>] [MODEL_FILE <pte[,pte...]>] [EXAMPLE <1|2|3>])
#       at configure time: checks the selection against custom_ops.yaml and custom_ops.bzl (a mistake is a configure
#       error naming the fix), writes the selection yamls into the build directory and sets CUSTOM_OPS_SELECTED,
#       CUSTOM_OPS_BY_CODEGEN (those registered by codegen; the others' sources register themselves),
#       CUSTOM_OPS_KERNEL_SOURCES, CUSTOM_OPS_AOT_SOURCES (empty unless a selected op is registered from C++),
#       CUSTOM_OPS_CUDA_SOURCES and CUSTOM_OPS_WITHOUT_PYTHON_SOURCES (the C++ registration and ATen-mode kernels of
#       the selected ops registered from Python, for processes without Python). Editing the yaml, the declarations or the model file re-runs it.
#   generate_kernel_bindings(OUTPUT_DIR <dir> SELECTION <yaml> [ATEN | MANUAL_REGISTRATION] SOURCES_VAR <var>)
#       at build time: the registration sources for the ExecuTorch runtime (a static initializer registers; with
#       MANUAL_REGISTRATION the application calls torch::executor::register_all_kernels() from <dir>/RegisterKernels.h),
#       or (ATEN) the schemas and CPU registration for the PyTorch AOT library.
#   generate_argument_kinds(OUTPUT_DIR <dir>)
#       at build time: <dir>/argument_kinds.h, the value kinds ExecuTorch's own kernels unbox, from PyTorch's schemas
#       (flow/argument_kinds.py), for the runner's check of a program's kernel calls, and the operators those kernels
#       register (flow/runtime_kernels.py), for its message when one is missing.
#   generate_python_op_schemas(OUTPUT_DIR <dir> SOURCES_VAR <var>)
#       at build time: <dir>/PythonOpSchemas.cpp, the C++ definitions of the schemas the selected ops registered from
#       Python define in their modules (CUSTOM_OPS_WITHOUT_PYTHON_OPS), each out schema checked against custom_ops.yaml;
#       again when a module changes.
#   generate_block_layouts_header(OUTPUT_DIR <dir>)
#       at configure time, again whenever ops/blocks/block_layouts.py changes: <dir>/ops/blocks/block_layouts.h, the
#       block formats' list and layouts as Python states them, which each format's traits are checked against when
#       it compiles (ops/blocks/formats.h); <dir> joins the include path. Stops when a stated format has no source in
#       ops/blocks/formats/, or a source there no stated layout.
#   generate_declared_dtypes_headers(OUTPUT_DIR <dir>)
#       at configure time, again whenever custom_ops.bzl or a Python op's module changes: each declared op's dtypes
#       as the DtypeSet its kernels take (declared_dtypes::<namespace>::<name>), in
#       <dir>/declared_dtypes/<namespace>/<name>.h, after checking that each Python-registered op's module states the
#       same DTYPES; <dir> joins the include path. One header per op, rewritten only when its op's set changes: an op
#       added or changed recompiles its own kernels, not every kernel.

set(CODEGEN_ENTRY_POINT "${CMAKE_CURRENT_LIST_DIR}/../codegen/run_codegen.py")
get_filename_component(CODEGEN_ENTRY_POINT "${CODEGEN_ENTRY_POINT}" ABSOLUTE)
get_filename_component(CUSTOM_OPS_REPO_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
file(GLOB CODEGEN_TEMPLATES CONFIGURE_DEPENDS "${CUSTOM_OPS_REPO_ROOT}/codegen/templates/*")

function(plan_custom_ops)
  cmake_parse_arguments(ARG "" "MODEL_FILE;EXAMPLE" "ROOT_OPS" ${ARGN})
  set(selection)
  if(ARG_MODEL_FILE)
    set(selection --model_file "${ARG_MODEL_FILE}")
    string(REPLACE "," ";" model_files "${ARG_MODEL_FILE}")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${model_files})
  elseif(ARG_ROOT_OPS)
    list(JOIN ARG_ROOT_OPS "," root_ops)
    set(selection --root_ops "${root_ops}")
  elseif(ARG_EXAMPLE)
    set(selection --example "${ARG_EXAMPLE}")
  endif()
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" "${CODEGEN_ENTRY_POINT}" plan --build_dir "${CMAKE_CURRENT_BINARY_DIR}" ${selection}
    RESULT_VARIABLE status
    OUTPUT_VARIABLE output
    ERROR_VARIABLE error)
  if(NOT status EQUAL 0)
    # The entry point's own `error:` line alone: importing torch may print unrelated noise around it.
    string(REGEX MATCH "error: [^\n]*" reason "${error}")
    if(NOT reason)
      set(reason "codegen/run_codegen.py plan failed:\n${error}")
    endif()
    message(FATAL_ERROR " ${reason}")  # indented: CMake prints it unwrapped, as one line
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
    "${CUSTOM_OPS_REPO_ROOT}/custom_ops.yaml" "${CUSTOM_OPS_REPO_ROOT}/custom_ops.bzl")
  include("${CMAKE_CURRENT_BINARY_DIR}/custom_ops_plan.cmake")
  foreach(var CUSTOM_OPS_SELECTED CUSTOM_OPS_BY_CODEGEN CUSTOM_OPS_KERNEL_SOURCES CUSTOM_OPS_AOT_SOURCES
          CUSTOM_OPS_CUDA_SOURCES CUSTOM_OPS_WITHOUT_PYTHON_SOURCES CUSTOM_OPS_WITHOUT_PYTHON_OPS
          CUSTOM_OPS_WITHOUT_PYTHON_MODULES)
    set(${var} "${${var}}" PARENT_SCOPE)
  endforeach()
endfunction()

function(generate_kernel_bindings)
  cmake_parse_arguments(ARG "ATEN;MANUAL_REGISTRATION" "OUTPUT_DIR;SELECTION;SOURCES_VAR" "" ${ARGN})
  if(ARG_ATEN)
    set(mode --aten)
    set(outputs "${ARG_OUTPUT_DIR}/RegisterSchema.cpp")  # the schemas and their CPU registration, one file
    set(headers "${ARG_OUTPUT_DIR}/CustomOpsNativeFunctions.h")
  elseif(ARG_MANUAL_REGISTRATION)
    set(mode --manual_registration)
    set(outputs "${ARG_OUTPUT_DIR}/RegisterKernelsEverything.cpp")
    set(headers "${ARG_OUTPUT_DIR}/NativeFunctions.h" "${ARG_OUTPUT_DIR}/RegisterKernels.h"
                "${ARG_OUTPUT_DIR}/RegistrationTables.h")
  else()
    set(mode)
    set(outputs "${ARG_OUTPUT_DIR}/RegisterCodegenUnboxedKernelsEverything.cpp")
    set(headers "${ARG_OUTPUT_DIR}/NativeFunctions.h" "${ARG_OUTPUT_DIR}/RegistrationTables.h")
  endif()
  add_custom_command(
    OUTPUT ${outputs} ${headers}
    COMMAND "${Python3_EXECUTABLE}" "${CODEGEN_ENTRY_POINT}" generate
            --selection "${ARG_SELECTION}" --output_dir "${ARG_OUTPUT_DIR}" ${mode}
    DEPENDS "${CUSTOM_OPS_REPO_ROOT}/custom_ops.yaml" "${CUSTOM_OPS_REPO_ROOT}/custom_ops.bzl" "${ARG_SELECTION}"
            ${CODEGEN_TEMPLATES} "${CODEGEN_ENTRY_POINT}"
    COMMENT "Generating kernel bindings in ${ARG_OUTPUT_DIR}"
    VERBATIM)
  set(${ARG_SOURCES_VAR} ${outputs} PARENT_SCOPE)
endfunction()

function(generate_argument_kinds)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "" ${ARGN})
  add_custom_command(
    OUTPUT "${ARG_OUTPUT_DIR}/argument_kinds.h"
    COMMAND "${Python3_EXECUTABLE}" "${CODEGEN_ENTRY_POINT}" argument_kinds --output "${ARG_OUTPUT_DIR}/argument_kinds.h"
    DEPENDS "${CODEGEN_ENTRY_POINT}" "${CUSTOM_OPS_REPO_ROOT}/flow/argument_kinds.py"
            "${CUSTOM_OPS_REPO_ROOT}/flow/xnnpack_layout.py" "${CUSTOM_OPS_REPO_ROOT}/flow/runtime_kernels.py"
    COMMENT "Generating the runner's table of argument kinds in ${ARG_OUTPUT_DIR}"
    VERBATIM)
endfunction()

function(generate_python_op_schemas)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR;SOURCES_VAR" "" ${ARGN})
  list(JOIN CUSTOM_OPS_WITHOUT_PYTHON_OPS "," ops)
  add_custom_command(
    OUTPUT "${ARG_OUTPUT_DIR}/PythonOpSchemas.cpp"
    COMMAND "${Python3_EXECUTABLE}" "${CODEGEN_ENTRY_POINT}" python_schemas --ops "${ops}"
            --output "${ARG_OUTPUT_DIR}/PythonOpSchemas.cpp"
    DEPENDS ${CUSTOM_OPS_WITHOUT_PYTHON_MODULES} "${CUSTOM_OPS_REPO_ROOT}/custom_ops.yaml"
            "${CUSTOM_OPS_REPO_ROOT}/codegen/python_op_schemas.py" "${CODEGEN_ENTRY_POINT}"
    COMMENT "Generating the C++ schemas of the ops registered from Python in ${ARG_OUTPUT_DIR}"
    VERBATIM)
  set(${ARG_SOURCES_VAR} "${ARG_OUTPUT_DIR}/PythonOpSchemas.cpp" PARENT_SCOPE)
endfunction()

function(generate_block_layouts_header)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "" ${ARGN})
  set(statement "${CUSTOM_OPS_REPO_ROOT}/ops/blocks/block_layouts.py")
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" "${statement}" "${ARG_OUTPUT_DIR}/ops/blocks/block_layouts.h"
    RESULT_VARIABLE status
    ERROR_VARIABLE error)
  if(NOT status EQUAL 0)
    string(REGEX MATCH "error: [^\n]*" reason "${error}")  # its own line: a layout or a source without the other
    if(NOT reason)
      set(reason "writing the block formats' C++ statement from ${statement} failed:\n${error}")
    endif()
    message(FATAL_ERROR " ${reason}")  # indented: CMake prints it unwrapped, as one line
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${statement}")
  include_directories("${ARG_OUTPUT_DIR}")
endfunction()

function(generate_declared_dtypes_headers)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "" ${ARGN})
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" "${CODEGEN_ENTRY_POINT}" declared_dtypes
            --output_dir "${ARG_OUTPUT_DIR}"
    RESULT_VARIABLE status
    OUTPUT_VARIABLE modules
    ERROR_VARIABLE error)
  if(NOT status EQUAL 0)
    string(REGEX MATCH "error: [^\n]*" reason "${error}")
    message(FATAL_ERROR " ${reason}")
  endif()
  string(REPLACE "\n" ";" modules "${modules}")
  list(FILTER modules EXCLUDE REGEX "^$")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${CUSTOM_OPS_REPO_ROOT}/custom_ops.bzl"
               "${CUSTOM_OPS_REPO_ROOT}/codegen/declared_dtypes.py" ${modules})
  include_directories("${ARG_OUTPUT_DIR}")
endfunction()
