# Use ccache when present. The sloppiness settings let ccache hit on translation units that use
# a precompiled header (the torch layers), which it otherwise refuses to cache.
find_program(VLM_CCACHE ccache)
if(VLM_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_MAXSIZE=5G
      ${VLM_CCACHE})
  message(STATUS "vlmtrain: using ccache (${VLM_CCACHE})")
endif()
