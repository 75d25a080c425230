// The isolation wire (private to compare/): what the child of an isolated ExportReader::Open()
// sends its parent over the pipe (export_reader.h "Isolation"). One message:
//   "LSI1", the Status code (int64) and message, and when it is ok: ExportMeta (every field, in
//   declaration order), the item locations (key "<checkpoint>/<rel>" -> data and scale Loc), the
//   item count and the bytes written to the spill file.
// Integers travel as 8 little-endian bytes, strings and vectors as their length then their
// elements. Decoding trusts nothing: every length is checked against what is left of the
// message, every narrow integer and enum against its range; a message that does not decode is an
// error, never a partial result. The field lists are structured bindings (isolated_wire.cpp): a
// struct that gains a field does not compile until the wire names it.
#pragma once

#include <string>
#include <string_view>

#include "export_index.h"
#include "lockstep/engine/status.h"

namespace lockstep {

// The child's answer: `s` when it is an error, else the meta and locations of `impl`.
std::string EncodeOpenResult(const Status& s, const ExportReader::Impl* impl);
// Fills impl->meta, impl->locs, impl->n_items and impl->spill_bytes from `wire`. Returns the
// child's Status when it sent an error; kInvalidArgument "... sent a malformed result ..." with
// *malformed set when the message does not decode (truncated, garbled, trailing bytes).
Status DecodeOpenResult(std::string_view wire, const std::string& file, ExportReader::Impl* impl,
                        bool* malformed);

}  // namespace lockstep
