// API-key checks of `lockstep serve`: the bearer token of an `Authorization` header compared with
// the server's key in constant time (the time does not depend on where the first differing byte
// is, nor on the length of the key: only on the length of what the client sent).
#pragma once

#include <string>
#include <string_view>

namespace lockstep {

// True when `a` and `b` are equal; reads every byte of `a` whatever `b` holds.
bool ConstantTimeEqual(std::string_view a, std::string_view b);

// True when `header` (the Authorization value) is "Bearer <key>" (the scheme in any case, one or
// more spaces) with <key> == `key`. An empty
// `key` means no key is configured: everything is allowed.
bool BearerAllowed(std::string_view header, const std::string& key);

}  // namespace lockstep
