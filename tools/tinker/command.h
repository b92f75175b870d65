// Command: one unit of work of the trainer server, executed by every rank
// in the same order (Note [One command stream]).
//
// Note [One command stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Rank 0 serves HTTP. Requests that change or read a model become Commands
// in one FIFO queue; rank 0 pops each, broadcasts its bytes to every rank
// (broadcast_command), and every rank executes it on its own replica of the
// model's Engine. Because every rank sees the same commands in the same
// order and validates them with the same deterministic checks before any
// collective, every rank reaches the same collectives, and a bad request
// fails on every rank before anything changed. Rank 0's result resolves the
// request's future. While idle, rank 0 broadcasts a "noop" every few
// seconds so that a backend with a collective timeout (gloo) never times
// out between requests.
//
// The header is free of LibTorch.
#ifndef ZEROSTEP_TOOLS_TINKER_COMMAND_H_
#define ZEROSTEP_TOOLS_TINKER_COMMAND_H_

#include <nlohmann/json.hpp>
#include <string>

#include "comm/communicator.h"
#include "tools/tinker/tenancy.h"

namespace zerostep {
namespace tinker {

struct Command {
  // "create_model", "forward_backward", "optim_step", "save_weights",
  // "load_weights", "get_info", "noop", "shutdown".
  std::string op;
  nlohmann::json args = nlohmann::json::object();  // the request's fields
  std::string blob;  // forward_backward: the protobuf request body
  // Who the request acts for: its tenant's models and files only (Note [One
  // tenant check] in tenancy.h), and its tenant's max_bytes.
  Caller caller;
};

// What a rank's execution of a Command produced.
struct CommandResult {
  bool ok = true;
  std::string error;              // when !ok: a complete sentence
  std::string category = "user";  // when !ok: "user" or "server"
  nlohmann::json json;            // the JSON result (most ops)
  std::string proto;              // forward_backward: ForwardBackwardOutput
  bool has_proto = false;
  // When !ok and the Service answers at once (run_now): the HTTP status
  // (rank 0's result only; never broadcast).
  int http_status = 400;

  static CommandResult failure(std::string error, std::string category);
};

std::string encode_command(const Command& c);
// Throws UsageError on bytes that are not an encoded Command.
Command decode_command(const std::string& bytes);

// A collective: rank 0's `*bytes` becomes every rank's `*bytes`.
void broadcast_bytes(Communicator& comm, std::string* bytes);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_COMMAND_H_
