// Reads an export's optional /ops tables (instrument/SCHEMA.md "/ops", issue 37) into ExportMeta:
// the op table, the op records with their L2 norms, and the dumped rows. Private to compare/; the
// bounded-reader rules apply (sizes checked before allocating, kInvalidArgument naming the path).
#pragma once

#include <hdf5.h>

#include "lockstep/compare/export_reader.h"

namespace lockstep {

// Nothing when the file has no /ops group (older files, runs without --op-digests).
Status ReadOps(hid_t file, const ReaderLimits& limits, ExportMeta* meta);

}  // namespace lockstep
