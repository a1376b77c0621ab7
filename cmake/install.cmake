# `cmake --install <build> --prefix P`: the public headers, each module's static library, the
# `cohort` executable, and a CMake package (cohortConfig.cmake) whose imported target
# cohort::cohort links every module. The libraries are static, so their private dependencies
# (oneDNN, oneTBB, OpenMP, zlib, xxhash, ...) are link dependencies of the exported targets and
# cohortConfig.cmake finds them for the user. Not the build's own targets (src/).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Dependency order, users first: a module lists only modules to its right.
set(cohort_modules core tensor reduce optim data checkpoint report config dist)
if(COHORT_ENGINE)
  list(PREPEND cohort_modules cli tokenizer export train nn)
  # (train uses dist: dist stays after it)
endif()
set(cohort_module_targets)
foreach(module IN LISTS cohort_modules)
  list(APPEND cohort_module_targets cohort_${module})
  # cohort::<module> for users, as in this build (the ALIAS targets).
  set_target_properties(cohort_${module} PROPERTIES EXPORT_NAME ${module})
endforeach()

# cohort::cohort: everything, for `target_link_libraries(app PRIVATE cohort::cohort)`.
add_library(cohort_all INTERFACE)
add_library(cohort::cohort ALIAS cohort_all)  # the same name inside this build
set_target_properties(cohort_all PROPERTIES EXPORT_NAME cohort)
target_link_libraries(cohort_all INTERFACE ${cohort_module_targets})

install(TARGETS ${cohort_module_targets} cohort_all EXPORT cohortTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(COHORT_ENGINE)
  # The installed binary keeps the link path as its RPATH: OpenBLAS's OpenMP build is found in
  # its own folder, not through the generic libopenblas.so.0 (cmake/FindOpenBLASOpenMP.cmake).
  set_target_properties(cohort PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS cohort RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/cohort ${PROJECT_BINARY_DIR}/include/cohort
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")

set(cohort_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
install(EXPORT cohortTargets NAMESPACE cohort:: DESTINATION ${cohort_cmake_dir})
configure_package_config_file(cmake/cohortConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cohortConfig.cmake
                              INSTALL_DESTINATION ${cohort_cmake_dir})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cohortConfig.cmake
              ${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/Findxxhash.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindOpenBLASOpenMP.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindPCRE2.cmake
        DESTINATION ${cohort_cmake_dir})
