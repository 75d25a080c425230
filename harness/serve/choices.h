// `n` > 1: n independent choices of one completion or chat request. Choice k is the request with
// seed + k (mod 2^64; a seedless sampled request draws its seed once first), run as its own
// engine request at the same time as the others, so each choice is bitwise what a request with
// n = 1 and that seed gives (and `lockstep generate --seed S+k`). The answer: choices[k] with
// index k, usage with the prompt counted once and the choices' completion tokens summed, and the
// `lockstep` object of choice 0 with `choices`: every choice's own lockstep object (request id,
// output ids, seed, export). Streaming with n > 1 is a 400 (one event stream per choice is not
// implemented). n = 1 goes straight to RunCompletion.
#pragma once

#include "serve/completion_request.h"

namespace httplib {
struct Response;
}

namespace lockstep {

struct ServeContext;

void RunChoices(ServeContext& ctx, CompletionRequest r, httplib::Response& res);

}  // namespace lockstep
