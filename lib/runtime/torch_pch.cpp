// Anchor translation unit for the shared precompiled header target.
#include "runtime/torch_pch.h"
