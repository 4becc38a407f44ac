// The shim is header-only; this file gives the target a source to compile.
#include "CWormholeSystem.h"
