// The main() both property suites share: a CI-sized default case budget
// (RC_PARAMS gets max_success=<ci_max_success> unless it sets max_success
// itself: the long mode), one compute thread, and a first line naming the
// budget and the runtime (BLAS, threads) so a run can be reproduced.
#ifndef ZEROSTEP_PROPERTYTESTS_PROPERTY_MAIN_H_
#define ZEROSTEP_PROPERTYTESTS_PROPERTY_MAIN_H_

namespace zerostep {

// Call first in main(): RapidCheck reads RC_PARAMS once, on first use.
void prepare_property_run(int ci_max_success);

}  // namespace zerostep

#endif  // ZEROSTEP_PROPERTYTESTS_PROPERTY_MAIN_H_
