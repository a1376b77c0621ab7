# Finds the OpenMP build of OpenBLAS (Debian's libopenblas-openmp-dev) as the imported target
# OpenBLAS::openmp. Debian installs each build of OpenBLAS (serial, pthread, OpenMP) in its own
# folder and points the generic libopenblas.so at one of them; cohort takes the OpenMP build by its
# folder: its GEMMs may be called from several threads at once and run on the calling thread when
# that thread's OpenMP limit is 1, as cohort's replicas set it (the serial build is not safe to
# call concurrently). Used by the build and, installed beside cohortConfig.cmake, by the package:
# cohort's static nn library needs it at the consumer's link.
include(FindPackageHandleStandardArgs)
set(_openblas_dir ${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
find_path(OPENBLAS_OPENMP_INCLUDE_DIR cblas.h PATHS /usr/include/${_openblas_dir} NO_DEFAULT_PATH)
find_library(OPENBLAS_OPENMP_LIBRARY openblas PATHS /usr/lib/${_openblas_dir} NO_DEFAULT_PATH)
find_package_handle_standard_args(OpenBLASOpenMP
  REQUIRED_VARS OPENBLAS_OPENMP_LIBRARY OPENBLAS_OPENMP_INCLUDE_DIR)
if(OpenBLASOpenMP_FOUND AND NOT TARGET OpenBLAS::openmp)
  add_library(OpenBLAS::openmp UNKNOWN IMPORTED)
  set_target_properties(OpenBLAS::openmp PROPERTIES
    IMPORTED_LOCATION "${OPENBLAS_OPENMP_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${OPENBLAS_OPENMP_INCLUDE_DIR}")
endif()
mark_as_advanced(OPENBLAS_OPENMP_INCLUDE_DIR OPENBLAS_OPENMP_LIBRARY)
unset(_openblas_dir)
