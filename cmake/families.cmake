# cmake/families.cmake: the hook families of shims/families.h (KVS_HOOK_FAMILIES), read from
# its rows as text, so the build names each family once, where the C code does.
#   KVSHIM_FAMILY_NAMES         cuda;llama;kvo: the folders shims/<name>, the targets
#                               kvshim_<name> (their objects go into libkvshim.so)
#   KVSHIM_FAMILY_INCLUDE_DIRS  shims/ and every shims/<name>: where families.h and the
#                               *_hooks.h it includes are found
set(kvshim_families_h ${PROJECT_SOURCE_DIR}/shims/families.h)
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${kvshim_families_h})
# (The rows end in a backslash, which would escape a list's ';': match the heads only.)
file(READ ${kvshim_families_h} kvshim_families_text)
string(REGEX MATCHALL "\n  X\\([A-Z_]+, [a-z_]+, \"" kvshim_family_rows "${kvshim_families_text}")
set(KVSHIM_FAMILY_NAMES "")
set(KVSHIM_FAMILY_INCLUDE_DIRS ${PROJECT_SOURCE_DIR}/shims)
foreach(row IN LISTS kvshim_family_rows)
  string(REGEX REPLACE "^\n  X\\([A-Z_]+, ([a-z_]+), .*" "\\1" name "${row}")
  list(APPEND KVSHIM_FAMILY_NAMES ${name})
  list(APPEND KVSHIM_FAMILY_INCLUDE_DIRS ${PROJECT_SOURCE_DIR}/shims/${name})
endforeach()
if(NOT KVSHIM_FAMILY_NAMES)
  message(FATAL_ERROR "kvshim: no KVS_HOOK_FAMILIES rows in ${kvshim_families_h}")
endif()
