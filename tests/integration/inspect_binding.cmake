# tests/integration/inspect_binding.cmake: `kvshim inspect` on a binding that links llama.cpp
# into itself (issue 16 item 5). Included from tests/integration/CMakeLists.txt after
# inspect.cmake, whose kvs_fx() builds the fixtures and whose check_inspect.py runs the cases
# (binding_internal, binding_plt: `check_inspect.py --list`).
if(NOT COMMAND kvs_fx)
  return()
endif()
# the C API exported, the implementation called directly (no relocation) / through the PLT
kvs_fx(fx_binding SHARED fx_binding.c)
kvs_fx(fx_binding_plt SHARED fx_binding.c)
target_compile_definitions(fx_binding_plt PRIVATE FX_VIA_PLT)
foreach(v binding binding_plt)
  kvs_fx(fx_${v}_main EXEC fx_binding_main.c RPATH)
  target_link_libraries(fx_${v}_main PRIVATE fx_${v})
endforeach()
