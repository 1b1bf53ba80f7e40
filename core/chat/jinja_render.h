#pragma once
// Jinja interpreter: syntax tree (jinja_parser.h) + context -> text, the last of the renderer's
// three stages. Semantics follow @huggingface/jinja (scoping of `set` inside loops, the `loop`
// object, output of none/undefined as nothing, JavaScript-flavoured equality and printing).
// Every render runs under RenderLimits: evaluation steps, the size of any string it builds (the
// output included) and of any list, so that a hostile template fails with InvalidArgument
// instead of hanging or exhausting memory. Stateless; concurrent renders of one tree are safe.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/chat/jinja_ast.h"
#include "core/chat/jinja_value.h"

namespace estuary::chat {

struct RenderLimits {
  size_t max_output_bytes = 8 << 20;  // also bounds every intermediate string
  int64_t max_steps = 5'000'000;      // roughly one per evaluated node; big copies count by size
  int64_t max_list_items = 1'000'000;
  std::optional<int64_t> now_epoch_seconds;  // strftime_now's clock; unset: the system clock
};

// Renders `program` with `context` (the template's variables, on top of the globals).
// InvalidArgument on errors: "line L, column C: ..." for evaluation errors; raise_exception's
// message unchanged (with the kRaisedPayload payload, see jinja_builtins.h).
absl::StatusOr<std::string> RenderProgram(const std::vector<NodePtr>& program,
                                          const Object& context, const RenderLimits& limits);

}  // namespace estuary::chat
