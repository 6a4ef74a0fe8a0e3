// The precompiled header shared by every torch target (see lib/CMakeLists.txt).
#pragma once
#include <torch/torch.h>
