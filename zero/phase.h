// Phase: the parts of a training step, as the labels the stages and the
// Engine give their collectives (the `label` of comm/communicator.h's option
// structs). The traffic ledger groups by them, so tests can assert, for
// example, that stage 0/1 in unmanaged mode moves nothing during backward.
//
//   kSetup     the Engine's construction, checkpoints, tools' own messages;
//   kForward   stage 3's parameter gathers before a block's forward;
//   kBackward  what backward() issues (gradient reduction, agreement);
//   kStep      what step() issues.
//
// Each is a constexpr array, so it has static storage duration as a label
// must; ledgers compare labels by text, never by address.
//
// Thread safety: constants.
#ifndef ZEROSTEP_ZERO_PHASE_H_
#define ZEROSTEP_ZERO_PHASE_H_

namespace zerostep::phase {

inline constexpr const char kSetup[] = "setup";
inline constexpr const char kForward[] = "forward";
inline constexpr const char kBackward[] = "backward";
inline constexpr const char kStep[] = "step";

}  // namespace zerostep::phase

#endif  // ZEROSTEP_ZERO_PHASE_H_
