# Writes build_info.h (lib/core/build_info.h.in) with the checkout's commit, "-dirty" when
# tracked files differ from it. Run by version.cmake at configure time and before every build
# (cmake -P), so a binary built after a commit or an edit says which source it is; the file is
# rewritten only when its text changes, so an unchanged checkout recompiles nothing.
# Inputs (-D): SOURCE_DIR, OUT, GIT_EXECUTABLE (may be empty), and what build_info.h.in names:
# PROJECT_VERSION, CMAKE_BUILD_TYPE, CMAKE_CXX_COMPILER_ID, CMAKE_CXX_COMPILER_VERSION.
set(VLM_GIT_HASH "unknown")
if(GIT_EXECUTABLE AND EXISTS "${SOURCE_DIR}/.git")
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
                  WORKING_DIRECTORY ${SOURCE_DIR}
                  OUTPUT_VARIABLE hash OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET RESULT_VARIABLE rc)
  if(rc EQUAL 0)
    set(VLM_GIT_HASH "${hash}")
    execute_process(COMMAND ${GIT_EXECUTABLE} status --porcelain --untracked-files=no
                    WORKING_DIRECTORY ${SOURCE_DIR}
                    OUTPUT_VARIABLE changes ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND NOT changes STREQUAL "")
      string(APPEND VLM_GIT_HASH "-dirty")
    endif()
  endif()
endif()
configure_file(${SOURCE_DIR}/lib/core/build_info.h.in ${OUT} @ONLY)
