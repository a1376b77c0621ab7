# Finds PCRE2's 8-bit library (Debian's libpcre2-dev ships no CMake config) as the imported target
# PCRE2::pcre2_8. Used by the build and, installed beside cohortConfig.cmake, by the package:
# cohort's static tokenizer library needs it at the consumer's link.
include(FindPackageHandleStandardArgs)
find_path(PCRE2_INCLUDE_DIR pcre2.h)
find_library(PCRE2_8_LIBRARY pcre2-8)
find_package_handle_standard_args(PCRE2 REQUIRED_VARS PCRE2_8_LIBRARY PCRE2_INCLUDE_DIR)
if(PCRE2_FOUND AND NOT TARGET PCRE2::pcre2_8)
  add_library(PCRE2::pcre2_8 UNKNOWN IMPORTED)
  set_target_properties(PCRE2::pcre2_8 PROPERTIES
    IMPORTED_LOCATION "${PCRE2_8_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${PCRE2_INCLUDE_DIR}")
endif()
mark_as_advanced(PCRE2_INCLUDE_DIR PCRE2_8_LIBRARY)
