# Locates packages that pip installed (executorch, torch, torchgen) through the Python interpreter that has them,
# so the build needs no ExecuTorch or PyTorch source tree.

# Sets <out_var> to the directory of Python package <package> (its import path) without importing it.
function(find_pip_package_dir out_var package)
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
            "import importlib.util as u; s = u.find_spec('${package}'); print(list(s.submodule_search_locations)[0])"
    OUTPUT_VARIABLE package_dir
    ERROR_VARIABLE error
    RESULT_VARIABLE status
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT status EQUAL 0 OR NOT IS_DIRECTORY "${package_dir}")
    message(FATAL_ERROR
      "Python package '${package}' is not installed for ${Python3_EXECUTABLE}.\n"
      "Install the pins from pyproject.toml (bash test_custom_ops.sh does it into .venv/) or pass "
      "-DPython3_EXECUTABLE=<python that has it>.\n${error}")
  endif()
  set(${out_var} "${package_dir}" PARENT_SCOPE)
endfunction()
