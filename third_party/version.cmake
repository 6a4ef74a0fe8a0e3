# Version string and git hash baked into the binary (vlmtrain --version, the log's first line):
# build_info.h, written by write_build_info.cmake at configure time and again before every
# build (target vlm_build_info), so that a rebuild after a commit or an edit never reports the
# commit of the last configure.
find_package(Git QUIET)
set(VLM_BUILD_INFO ${CMAKE_BINARY_DIR}/generated/vlm/build_info.h)
set(VLM_BUILD_INFO_ARGS
    -DSOURCE_DIR=${CMAKE_SOURCE_DIR} -DOUT=${VLM_BUILD_INFO} -DGIT_EXECUTABLE=${GIT_EXECUTABLE}
    -DPROJECT_VERSION=${PROJECT_VERSION} -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}
    -DCMAKE_CXX_COMPILER_ID=${CMAKE_CXX_COMPILER_ID}
    -DCMAKE_CXX_COMPILER_VERSION=${CMAKE_CXX_COMPILER_VERSION})
execute_process(COMMAND ${CMAKE_COMMAND} ${VLM_BUILD_INFO_ARGS}
                        -P ${CMAKE_SOURCE_DIR}/third_party/write_build_info.cmake)
add_custom_target(vlm_build_info
                  COMMAND ${CMAKE_COMMAND} ${VLM_BUILD_INFO_ARGS}
                          -P ${CMAKE_SOURCE_DIR}/third_party/write_build_info.cmake
                  BYPRODUCTS ${VLM_BUILD_INFO}
                  COMMENT "build_info.h: the checkout's commit")
