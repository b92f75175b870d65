// Forwarding header: Precision and its rounding rules moved to the leaf
// package precision/ (config/ and zero/ both use it). Include
// "precision/precision.h" and depend on //precision instead; this header
// and //zero:precision remain for one release (CHANGELOG.md).
#ifndef ZEROSTEP_ZERO_PRECISION_H_
#define ZEROSTEP_ZERO_PRECISION_H_

#include "precision/precision.h"

#endif  // ZEROSTEP_ZERO_PRECISION_H_
