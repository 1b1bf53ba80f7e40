#pragma once
// Random bytes for secrets and for names that must not be guessed (the router's request ids,
// `estuary up`'s cluster token): the kernel's CSPRNG (getrandom(2), else /dev/urandom). The
// generators of absl and of <random> are not cryptographic; never use them for these.

#include <cstddef>
#include <string>

namespace estuary {

// `bytes` random bytes as 2 * `bytes` lower-case hex digits.
std::string SecureRandomHex(size_t bytes);

}  // namespace estuary
