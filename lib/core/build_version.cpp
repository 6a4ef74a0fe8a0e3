#include "core/build_version.h"

#include <unistd.h>

#include "vlm/build_info.h"

namespace vlm {

std::string build_version() { return VLM_VERSION; }

std::string build_commit() { return VLM_GIT_HASH; }

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

}  // namespace vlm
