#pragma once
// Status propagation helpers. Prefixed to avoid clashes with other libraries' macros.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ESTUARY_STATUS_CONCAT_INNER(a, b) a##b
#define ESTUARY_STATUS_CONCAT(a, b) ESTUARY_STATUS_CONCAT_INNER(a, b)

// Returns from the current function when `expr` (an absl::Status) is not OK.
#define ESTUARY_RETURN_IF_ERROR(expr)                    \
  do {                                                   \
    if (absl::Status _estuary_status = (expr); !_estuary_status.ok()) { \
      return _estuary_status;                            \
    }                                                    \
  } while (0)

// `ESTUARY_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value of a StatusOr or returns its
// error.
#define ESTUARY_ASSIGN_OR_RETURN(lhs, expr) \
  ESTUARY_ASSIGN_OR_RETURN_IMPL(ESTUARY_STATUS_CONCAT(_estuary_statusor_, __LINE__), lhs, expr)

#define ESTUARY_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
