# Version string and git hash baked into the binary (vlmtrain --version).
find_package(Git QUIET)
set(VLM_GIT_HASH "unknown")
if(GIT_FOUND AND EXISTS "${CMAKE_SOURCE_DIR}/.git")
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
                  WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                  OUTPUT_VARIABLE VLM_GIT_HASH OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET RESULT_VARIABLE _vlm_git_rc)
  if(NOT _vlm_git_rc EQUAL 0)
    set(VLM_GIT_HASH "unknown")
  endif()
endif()
configure_file(${CMAKE_SOURCE_DIR}/lib/core/build_info.h.in
               ${CMAKE_BINARY_DIR}/generated/vlm/build_info.h @ONLY)
