// Forwarding header: engine/config.h moved to config/config.h (the ds_config
// parser became its own package, //config, on 2026-11-30). Include
// "config/config.h" and depend on @zerostep//config; this header and the
// @zerostep//engine:config target stay for one release (CHANGELOG.md,
// docs/api.md "Moved and removed").
#ifndef ZEROSTEP_ENGINE_CONFIG_H_
#define ZEROSTEP_ENGINE_CONFIG_H_

#pragma message( \
    "engine/config.h is deprecated: include config/config.h (@zerostep//config)")

#include "config/config.h"

#endif  // ZEROSTEP_ENGINE_CONFIG_H_
