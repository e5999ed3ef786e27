# Selective build and kernel-binding codegen with the tools the executorch wheel ships (executorch.codegen.*).
# The wheel ships no codegen templates; this project's own live in codegen/templates/.
#
#   select_operators(OUTPUT <yaml> ROOT_OPS <op;op...> | MODEL_FILE <pte>)
#   generate_kernel_bindings(OUTPUT_DIR <dir> CUSTOM_OPS_YAML <yaml> SELECTED_OPS <yaml> [ATEN] SOURCES_VAR <var>)

set(CODEGEN_TEMPLATE_ROOT "${CMAKE_CURRENT_LIST_DIR}/../codegen")
file(GLOB CODEGEN_TEMPLATES CONFIGURE_DEPENDS "${CODEGEN_TEMPLATE_ROOT}/templates/*")

# Writes the selected-operators yaml that codegen filters on: either the listed root ops, or every op a program uses.
function(select_operators)
  cmake_parse_arguments(ARG "" "OUTPUT;MODEL_FILE" "ROOT_OPS" ${ARGN})
  if(ARG_MODEL_FILE)
    set(selection_args --model_file_path "${ARG_MODEL_FILE}")
    set(selection_deps "${ARG_MODEL_FILE}")
  elseif(ARG_ROOT_OPS)
    list(JOIN ARG_ROOT_OPS "," root_ops)
    # A stamp that changes only when the op list does, so editing the list (and only that) re-runs the selection.
    set(stamp "${ARG_OUTPUT}.root_ops")
    file(CONFIGURE OUTPUT "${stamp}" CONTENT "${root_ops}\n")
    set(selection_args --root_ops "${root_ops}")
    set(selection_deps "${stamp}")
  else()
    message(FATAL_ERROR "select_operators: give ROOT_OPS or MODEL_FILE")
  endif()
  add_custom_command(
    OUTPUT "${ARG_OUTPUT}"
    COMMAND "${Python3_EXECUTABLE}" -m executorch.codegen.tools.gen_oplist
            --output_path "${ARG_OUTPUT}" ${selection_args}
    DEPENDS ${selection_deps}
    COMMENT "Selecting operators: ${selection_args}"
    VERBATIM)
endfunction()

# Runs executorch.codegen.gen on custom_ops.yaml + the selection. ExecuTorch mode gives the registration of the
# selected kernels into the ExecuTorch runtime; ATEN mode gives their schema + CPU registration for PyTorch.
function(generate_kernel_bindings)
  cmake_parse_arguments(ARG "ATEN" "OUTPUT_DIR;CUSTOM_OPS_YAML;SELECTED_OPS;SOURCES_VAR" "" ${ARGN})
  find_pip_package_dir(torchgen_dir torchgen)
  set(aten_yaml_dir "${torchgen_dir}/packaged/ATen/native")
  if(ARG_ATEN)
    set(mode_args --use-aten-lib)
    set(outputs "${ARG_OUTPUT_DIR}/RegisterCPUCustomOps.cpp" "${ARG_OUTPUT_DIR}/RegisterSchema.cpp")
    set(headers "${ARG_OUTPUT_DIR}/CustomOpsNativeFunctions.h")
  else()
    set(mode_args)
    set(outputs "${ARG_OUTPUT_DIR}/RegisterCodegenUnboxedKernelsEverything.cpp")
    set(headers "${ARG_OUTPUT_DIR}/NativeFunctions.h")
  endif()
  add_custom_command(
    OUTPUT ${outputs} ${headers}
    COMMAND "${Python3_EXECUTABLE}" -m executorch.codegen.gen
            --source-path "${CODEGEN_TEMPLATE_ROOT}"
            --install-dir "${ARG_OUTPUT_DIR}"
            --custom-ops-yaml-path "${ARG_CUSTOM_OPS_YAML}"
            --op-selection-yaml-path "${ARG_SELECTED_OPS}"
            --tags-path "${aten_yaml_dir}/tags.yaml"
            --aten-yaml-path "${aten_yaml_dir}/native_functions.yaml"
            ${mode_args}
    DEPENDS "${ARG_CUSTOM_OPS_YAML}" "${ARG_SELECTED_OPS}" ${CODEGEN_TEMPLATES}
    COMMENT "Generating kernel bindings in ${ARG_OUTPUT_DIR}"
    VERBATIM)
  set(${ARG_SOURCES_VAR} ${outputs} PARENT_SCOPE)
endfunction()
