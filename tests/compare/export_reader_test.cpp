// ExportReader (compare/export_reader.h): reads real exports written by `lockstep generate
// --export` (meta, checkpoint attributes, items, rows bit-identical to H5Dread, concurrent
// readers), rejects a corpus of malformed files with kInvalidArgument (exit 2) naming the in-file
// path, and reads layouts the exporter never writes (chunked + deflate, big-endian) through the
// H5Dread fallback.
#include "lockstep/compare/export_reader.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "lockstep/h5/handle.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

struct Generated {
  std::string path, jsonl, err;
};

Generated Generate(const std::string& name, const std::string& extra) {
  Generated g;
  const std::string dir = test::NewDir(name);
  g.path = dir + "/a.h5";
  g.jsonl = dir + "/a.jsonl";
  auto r =
      test::RunLockstep("generate --model " + test::ModelDir("tiny") +
                        " --prompt 'hello hello hello' --max-new 8 --spec 2 --threads 1 --export " +
                        g.path + " --export-windows all --trace-jsonl " + g.jsonl + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  g.err = r.err;
  return g;
}

// One export per cache dtype, written once per process.
const Generated& F32() {
  static const Generated g = Generate("f32", "");
  return g;
}
const Generated& Int8() {
  static const Generated g = Generate("int8", "--kv int8");
  return g;
}
const Generated& Bf16() {
  static const Generated g = Generate("bf16", "--kv bf16");
  return g;
}

std::unique_ptr<ExportReader> OpenOk(const std::string& path, const ReaderLimits& limits = {}) {
  auto r = ExportReader::Open(path, limits);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

hid_t NativeType(const std::string& dtype) {
  return dtype == "f32" ? H5T_NATIVE_FLOAT : dtype == "bf16" ? H5T_NATIVE_UINT16 : H5T_NATIVE_INT8;
}

// Ground truth: the whole dataset through H5Dread, converted to `mem_type`.
std::vector<char> H5Whole(const std::string& file, const std::string& path, hid_t mem_type) {
  H5Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5Handle ds(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT));
  EXPECT_TRUE(ds.valid()) << path;
  H5Handle sp(H5Dget_space(ds.get()));
  const auto n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(sp.get()));
  std::vector<char> out(n * H5Tget_size(mem_type));
  if (n > 0) {
    EXPECT_GE(H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), 0) << path;
  }
  return out;
}

std::string ItemPath(const ExportCheckpoint& cp, const ExportItem& it) {
  return "/checkpoints/" + cp.name + "/" + it.rel;
}

std::vector<char> ReadAllRows(const ExportReader& r, const ExportCheckpoint& cp,
                              const ExportItem& it, std::int64_t block = 0) {
  const auto row_bytes = static_cast<std::size_t>(it.row_elems()) * it.elem_bytes();
  std::vector<char> out(static_cast<std::size_t>(it.rows()) * row_bytes);
  if (block <= 0) block = std::max<std::int64_t>(it.rows(), 1);
  for (std::int64_t r0 = 0; r0 < it.rows(); r0 += block) {
    const std::int64_t n = std::min(block, it.rows() - r0);
    Status s = r.ReadRows(cp, it, r0, n, out.data() + static_cast<std::size_t>(r0) * row_bytes);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return out;
}

// The spellings of an item's kind and dtype and a checkpoint's point, as the file writes them.
std::string Kind(const ExportItem& it) { return ItemKindName(it.kind); }
std::string Dtype(const ExportItem& it) { return std::string(dtype_name(it.dtype)); }
std::string Point(const ExportCheckpoint& cp) { return CheckpointPointName(cp.point); }

int KindIndex(const std::string& k) {
  static const std::vector<std::string> kinds = {"k",          "v",         "k_spec", "v_spec",
                                                 "conv_state", "ssm_state", "mtp_k",  "mtp_v",
                                                 "hidden_out", "logits"};
  return static_cast<int>(std::find(kinds.begin(), kinds.end(), k) - kinds.begin());
}

// ---- (a) real exports ----

TEST(ExportReader, MetaMatchesTraceAndCheckpoints) {
  const Generated& g = F32();
  auto reader = OpenOk(g.path);
  ASSERT_TRUE(reader);
  const ExportMeta& m = reader->meta();
  EXPECT_EQ(m.schema, "lockstep.export");
  EXPECT_EQ(m.schema_version, 1);
  EXPECT_EQ(m.run_id.size(), 16u);
  EXPECT_EQ(m.model_sha256.size(), 64u);
  EXPECT_EQ(m.file_bytes, static_cast<std::int64_t>(fs::file_size(g.path)));
  EXPECT_NE(m.config_json.find('{'), std::string::npos);
  EXPECT_EQ(m.max_new, 8);
  EXPECT_FALSE(m.request_tokens.empty());
  EXPECT_FALSE(m.output_tokens.empty());
  EXPECT_LE(m.output_tokens.size(), 8u);
  EXPECT_TRUE(m.stop_reason == "eos" || m.stop_reason == "length") << m.stop_reason;

  auto trace = ReadWindowRecords(g.jsonl);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_EQ(m.windows.size(), trace->size());
  std::size_t emitted = 0;
  for (std::size_t i = 0; i < m.windows.size(); ++i) {
    const WindowRecord &a = m.windows[i], &b = (*trace)[i];
    // Every path field the HDF5 trace holds (draft and emitted tokens are JSON-lines only).
    EXPECT_EQ(std::make_tuple(a.idx, a.p, a.T, a.T_mtp, a.merged, a.from_sfx, a.chain_n, a.accepted,
                              a.first_call),
              std::make_tuple(b.idx, b.p, b.T, b.T_mtp, b.merged, b.from_sfx, b.chain_n, b.accepted,
                              b.first_call))
        << "window " << i;
    EXPECT_EQ(a.source, b.source) << "window " << i;
    EXPECT_TRUE(a.draft.empty() && a.emitted.empty());
    EXPECT_EQ(a.verify_ns, b.verify_ns);
    EXPECT_EQ(a.export_ns, b.export_ns);
    emitted += static_cast<std::size_t>(b.accepted + 1);
  }
  EXPECT_GE(emitted, m.output_tokens.size());

  // Every window exported all three points, in (window, point) order.
  ASSERT_EQ(m.checkpoints.size(), 3 * m.windows.size());
  const char* points[] = {"pre_verify", "post_verify", "commit"};
  for (std::size_t i = 0; i < m.checkpoints.size(); ++i) {
    const ExportCheckpoint& cp = m.checkpoints[i];
    const WindowRecord& w = m.windows[i / 3];
    char name[64];
    std::snprintf(name, sizeof(name), "%05d_%s", w.idx, points[i % 3]);
    EXPECT_EQ(cp.name, name);
    EXPECT_EQ(cp.window, w.idx);
    EXPECT_EQ(Point(cp), points[i % 3]);
    EXPECT_EQ(cp.p, w.p);
    EXPECT_EQ(cp.T, w.T);
    if (Point(cp) == "commit") {
      EXPECT_EQ(cp.committed_rows, w.p + w.accepted + 1);
      EXPECT_EQ(cp.recurrent_pos, w.p + w.accepted + 1);
    } else {
      EXPECT_EQ(cp.committed_rows, w.p);
      EXPECT_EQ(cp.recurrent_pos, w.p);
    }
    EXPECT_EQ(cp.spec_rows, Point(cp) == "post_verify" ? w.T : 0);
    // Items sorted by (stage, layer with -1 last, kind order); valid rows only.
    for (std::size_t j = 0; j < cp.items.size(); ++j) {
      const ExportItem& it = cp.items[j];
      EXPECT_EQ(Dtype(it), "f32");
      EXPECT_EQ(it.valid_rows, it.rows());
      EXPECT_GE(it.capacity_rows, it.valid_rows);
      EXPECT_FALSE(it.has_scales);
      if (Kind(it) == "k" || Kind(it) == "v") {
        EXPECT_EQ(it.rows(), cp.committed_rows) << cp.name << " " << it.rel;
      }
      if (Kind(it) == "k_spec" || Kind(it) == "hidden_out" || Kind(it) == "logits") {
        EXPECT_EQ(it.rows(), cp.T) << cp.name << " " << it.rel;
      }
      if (j == 0) continue;
      const ExportItem& prev = cp.items[j - 1];
      auto key = [](const ExportItem& x) {
        return std::make_tuple(x.stage, x.layer < 0 ? 1 << 30 : x.layer, KindIndex(Kind(x)));
      };
      EXPECT_LT(key(prev), key(it)) << cp.name << ": " << prev.rel << " before " << it.rel;
    }
  }
  // The CLI's "items per checkpoint (pre_verify / post_verify / commit): a / b / c" (window 0).
  std::smatch sm;
  ASSERT_TRUE(std::regex_search(g.err, sm, std::regex(R"(commit\): (\d+) / (\d+) / (\d+))")))
      << g.err;
  for (int p = 0; p < 3; ++p)
    EXPECT_EQ(m.checkpoints[static_cast<std::size_t>(p)].items.size(), std::stoul(sm[p + 1]));

  // Counters of every stage; first_call_ns is not measured on the CPU backend.
  ASSERT_EQ(m.counters.size(), 4u);
  EXPECT_EQ(m.counters.at("stage0").at("first_call_ns"), -1);
  EXPECT_GT(m.counters.at("stage0").at("verify_calls"), 0);
  auto has_line = [&](const std::string& s) {
    return std::find(m.unknowns.begin(), m.unknowns.end(), s) != m.unknowns.end();
  };
  EXPECT_TRUE(has_line("counters/stage0 first_call_ns"));
  EXPECT_TRUE(has_line("counters/stage3 first_call_ns"));
  if (m.sampler.nvml != "read") {
    EXPECT_TRUE(has_line("nvml: " + m.sampler.nvml));
  }
  EXPECT_EQ(m.sampler.n_samples > 0, m.sampler.max_rss_bytes > 0);
}

TEST(ExportReader, RowsEqualH5DreadAndBoundsAreChecked) {
  const Generated& g = F32();
  auto reader = OpenOk(g.path);
  ASSERT_TRUE(reader);
  std::size_t n_items = 0;
  for (const auto& cp : reader->meta().checkpoints)
    for (const auto& it : cp.items) {
      const auto truth = H5Whole(g.path, ItemPath(cp, it), H5T_NATIVE_FLOAT);
      EXPECT_TRUE(reader->ReadsDirectly(cp, it)) << ItemPath(cp, it) << " is contiguous";
      EXPECT_EQ(ReadAllRows(*reader, cp, it), truth) << ItemPath(cp, it);
      EXPECT_EQ(ReadAllRows(*reader, cp, it, 2), truth)
          << ItemPath(cp, it) << " in blocks of 2 rows";
      ++n_items;
    }
  EXPECT_GT(n_items, 50u);
  const ExportCheckpoint& cp = reader->meta().checkpoints.back();
  const ExportItem& it = cp.items.front();
  std::vector<char> buf(static_cast<std::size_t>(it.rows() * it.row_elems()) * it.elem_bytes() +
                        64);
  EXPECT_TRUE(reader->ReadRows(cp, it, it.rows(), 0, buf.data()).ok())
      << "empty range at the end is fine";
  for (auto [r0, n] : {std::pair<std::int64_t, std::int64_t>{it.rows(), 1},
                       {-1, 1},
                       {0, -1},
                       {1, it.rows()},
                       {std::int64_t{1} << 62, std::int64_t{1} << 62}}) {
    Status s = reader->ReadRows(cp, it, r0, n, buf.data());
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << r0 << "+" << n;
    EXPECT_NE(s.message().find(it.rel), std::string::npos) << s.message();
  }
  ExportItem stranger = it;
  stranger.rel = "stage9/layer99/k";
  EXPECT_EQ(reader->ReadRows(cp, stranger, 0, 1, buf.data()).code(),
            Status::Code::kInvalidArgument);
  std::vector<float> sc(64);
  EXPECT_EQ(reader->ReadScaleRows(cp, it, 0, 1, sc.data()).code(), Status::Code::kInvalidArgument)
      << "f32 items have no scales";
}

TEST(ExportReader, ConcurrentReadersSeeTheSameBytes) {
  const Generated& g = F32();
  auto reader = OpenOk(g.path);
  ASSERT_TRUE(reader);
  std::vector<std::pair<const ExportCheckpoint*, const ExportItem*>> all;
  std::vector<std::vector<char>> truth;
  for (const auto& cp : reader->meta().checkpoints)
    for (const auto& it : cp.items) {
      all.emplace_back(&cp, &it);
      truth.push_back(H5Whole(g.path, ItemPath(cp, it), H5T_NATIVE_FLOAT));
    }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep)
        for (std::size_t k = 0; k < all.size(); ++k) {
          const std::size_t i =
              (k * 7 + static_cast<std::size_t>(t) * 13) % all.size();  // different orders
          if (ReadAllRows(*reader, *all[i].first, *all[i].second, 1 + t) != truth[i]) ++mismatches;
        }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ExportReader, Int8ItemsHaveScales) {
  const Generated& g = Int8();
  auto reader = OpenOk(g.path);
  ASSERT_TRUE(reader);
  int n_scaled = 0;
  for (const auto& cp : reader->meta().checkpoints)
    for (const auto& it : cp.items) {
      const bool kv = Kind(it) == "k" || Kind(it) == "v" || Kind(it) == "k_spec" ||
                      Kind(it) == "v_spec" || Kind(it) == "mtp_k" || Kind(it) == "mtp_v";
      EXPECT_EQ(Dtype(it), kv ? "int8" : "f32") << ItemPath(cp, it);
      EXPECT_EQ(it.has_scales, kv) << ItemPath(cp, it);
      EXPECT_EQ(ReadAllRows(*reader, cp, it),
                H5Whole(g.path, ItemPath(cp, it), NativeType(Dtype(it))))
          << ItemPath(cp, it);
      if (!it.has_scales) continue;
      ++n_scaled;
      ASSERT_EQ(it.scale_row_elems, it.shape[1]);
      std::vector<float> sc(static_cast<std::size_t>(it.rows() * it.scale_row_elems));
      ASSERT_TRUE(reader->ReadScaleRows(cp, it, 0, it.rows(), sc.data()).ok());
      const auto truth = H5Whole(g.path, ItemPath(cp, it) + "_scale", H5T_NATIVE_FLOAT);
      ASSERT_EQ(truth.size(), sc.size() * sizeof(float));
      EXPECT_EQ(std::memcmp(truth.data(), sc.data(), truth.size()), 0) << ItemPath(cp, it);
      if (it.rows() > 1) {
        std::vector<float> one(static_cast<std::size_t>(it.scale_row_elems));
        ASSERT_TRUE(reader->ReadScaleRows(cp, it, 1, 1, one.data()).ok());
        EXPECT_EQ(std::memcmp(one.data(), truth.data() + one.size() * sizeof(float),
                              one.size() * sizeof(float)),
                  0);
      }
      EXPECT_EQ(reader->ReadScaleRows(cp, it, it.rows(), 1, sc.data()).code(),
                Status::Code::kInvalidArgument);
    }
  EXPECT_GT(n_scaled, 10);
}

TEST(ExportReader, Bf16ItemsAreRawBits) {
  const Generated& g = Bf16();
  auto reader = OpenOk(g.path);
  ASSERT_TRUE(reader);
  int n_bf16 = 0;
  for (const auto& cp : reader->meta().checkpoints)
    for (const auto& it : cp.items) {
      if (Dtype(it) == "bf16") {
        ++n_bf16;
        EXPECT_EQ(it.elem_bytes(), 2u);
      }
      EXPECT_EQ(ReadAllRows(*reader, cp, it, 3),
                H5Whole(g.path, ItemPath(cp, it), NativeType(Dtype(it))));
    }
  EXPECT_GT(n_bf16, 10);
}

TEST(ExportReader, LooksLikeHdf5) {
  EXPECT_TRUE(LooksLikeHdf5(F32().path));
  const std::string text = test::NewDir("sig") + "/t.txt";
  std::ofstream(text) << "hello";
  EXPECT_FALSE(LooksLikeHdf5(text));
  EXPECT_FALSE(LooksLikeHdf5(text + ".missing"));
}

// ---- (b) malformed files ----

std::string CopyOf(const std::string& src, const std::string& name) {
  const std::string dst = test::NewDir("bad") + "/" + name + ".h5";
  fs::copy_file(src, dst);
  return dst;
}

// A copy of `src` changed through the HDF5 API. The copy loses its /index/items (unless
// `keep_index`), so the reader validates every dataset the slow way, as it does for files written
// by other tools.
std::string Mutated(const std::string& name, const std::function<void(hid_t)>& change,
                    const std::string& src = "", bool keep_index = false) {
  const std::string dst = CopyOf(src.empty() ? F32().path : src, name);
  H5Handle f(H5Fopen(dst.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  EXPECT_TRUE(f.valid());
  if (!keep_index) {
    EXPECT_GE(H5Ldelete(f.get(), "/index", H5P_DEFAULT), 0);
  }
  change(f.get());
  EXPECT_TRUE(f.reset());
  return dst;
}

void SetInt(hid_t loc, const std::string& obj, const char* name, std::int64_t v,
            hid_t file_type = H5T_STD_I64LE) {
  H5Handle o(H5Oopen(loc, obj.c_str(), H5P_DEFAULT));
  ASSERT_TRUE(o.valid()) << obj;
  if (H5Aexists(o.get(), name) > 0) H5Adelete(o.get(), name);
  H5Handle sp(H5Screate(H5S_SCALAR));
  H5Handle a(H5Acreate2(o.get(), name, file_type, sp.get(), H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_GE(H5Awrite(a.get(), H5T_NATIVE_INT64, &v), 0);
}

void SetStr(hid_t loc, const std::string& obj, const char* name, const std::string& v) {
  H5Handle o(H5Oopen(loc, obj.c_str(), H5P_DEFAULT));
  ASSERT_TRUE(o.valid()) << obj;
  if (H5Aexists(o.get(), name) > 0) H5Adelete(o.get(), name);
  H5Handle t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), std::max<std::size_t>(v.size(), 1));
  H5Handle sp(H5Screate(H5S_SCALAR));
  H5Handle a(H5Acreate2(o.get(), name, t.get(), sp.get(), H5P_DEFAULT, H5P_DEFAULT));
  std::string buf = v;
  buf.resize(std::max<std::size_t>(v.size(), 1));
  ASSERT_GE(H5Awrite(a.get(), t.get(), buf.data()), 0);
}

// Replaces the dataset at `path` by an empty (never written) f32 dataset of `dims` carrying the
// item attributes of a valid item with valid_rows = dims[0].
void ReplaceWithUnwritten(hid_t f, const std::string& path, std::vector<hsize_t> dims) {
  ASSERT_GE(H5Ldelete(f, path.c_str(), H5P_DEFAULT), 0);
  H5Handle sp(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  ASSERT_TRUE(sp.valid());
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_LATE);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  H5Handle ds(
      H5Dcreate2(f, path.c_str(), H5T_IEEE_F32LE, sp.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  ASSERT_TRUE(ds.valid()) << path;
  ds.reset();
  SetStr(f, path, "kind", "k");
  SetInt(f, path, "stage", 1);
  SetInt(f, path, "layer", 3);
  SetInt(f, path, "valid_rows", static_cast<std::int64_t>(dims[0]));
  SetInt(f, path, "capacity_rows", static_cast<std::int64_t>(dims[0]));
  SetStr(f, path, "dtype", "f32");
}

void ExpectRejected(const std::string& file, const std::string& needle,
                    const ReaderLimits& limits = {}) {
  auto r = ExportReader::Open(file, limits);
  ASSERT_FALSE(r.ok()) << file << " was accepted; expected an error mentioning '" << needle << "'";
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

const std::string kK = "/checkpoints/00001_commit/stage1/layer3/k";

TEST(ExportReaderCorpus, NotHdf5) {
  const std::string dir = test::NewDir("nothdf5");
  std::ofstream(dir + "/empty.h5").close();
  ExpectRejected(dir + "/empty.h5", "empty");
  std::mt19937 rng(7);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  std::ofstream(dir + "/noise.h5", std::ios::binary) << noise;
  ExpectRejected(dir + "/noise.h5", "not an HDF5 file");
  std::ofstream(dir + "/text.h5") << "schema = lockstep.export\nschema_version = 1\n";
  ExpectRejected(dir + "/text.h5", "not an HDF5 file");
  ExpectRejected(dir, "not a regular file");
  auto missing = ExportReader::Open(dir + "/missing.h5");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().exit_code(), 2) << missing.status().ToString();
}

TEST(ExportReaderCorpus, UnreadableIsAnIOError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  const std::string p = CopyOf(F32().path, "unreadable");
  fs::permissions(p, fs::perms::none);
  auto r = ExportReader::Open(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kIOError) << r.status().ToString();
  EXPECT_EQ(r.status().exit_code(), 3);
}

TEST(ExportReaderCorpus, TruncatedCopies) {
  const auto size = static_cast<std::int64_t>(fs::file_size(F32().path));
  for (std::int64_t cut :
       {std::int64_t{0}, std::int64_t{7}, std::int64_t{512}, size / 2, size - 1}) {
    const std::string p = CopyOf(F32().path, "cut" + std::to_string(cut));
    fs::resize_file(p, static_cast<std::uintmax_t>(cut));
    ExpectRejected(p, p);
  }
}

TEST(ExportReaderCorpus, SchemaIdentity) {
  const std::string bare = test::NewDir("bare") + "/bare.h5";
  H5Handle f(H5Fcreate(bare.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  f.reset();
  ExpectRejected(bare, "not a lockstep.export v1 file: schema '(missing)'");
  ExpectRejected(Mutated("schema", [](hid_t h) { SetStr(h, "/", "schema", "other.export"); }),
                 "not a lockstep.export v1 file: schema 'other.export' version 1");
  ExpectRejected(Mutated("version", [](hid_t h) { SetInt(h, "/", "schema_version", 2); }),
                 "not a lockstep.export v1 file: schema 'lockstep.export' version 2");
  ExpectRejected(Mutated("noversion", [](hid_t h) { H5Adelete(h, "schema_version"); }),
                 "version (missing)");
}

// /trace/stages as the writer lays it out, with the given rows (window, stage, host ns x3, device
// ns x4, graph code).
struct StageRowT {
  std::int32_t window, stage;
  std::int64_t ns[7];
  std::uint8_t graph;
};
void WriteStageRows(hid_t h, const std::vector<StageRowT>& rows) {
  H5Ldelete(h, "/trace/stages", H5P_DEFAULT);
  H5Handle t(H5Tcreate(H5T_COMPOUND, sizeof(StageRowT)));
  H5Tinsert(t.get(), "window", HOFFSET(StageRowT, window), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "stage", HOFFSET(StageRowT, stage), H5T_NATIVE_INT32);
  const char* names[7] = {"wait_ns",        "compute_ns",  "cpu_ns", "dev_wait_ns",
                          "dev_compute_ns", "dev_copy_ns", "init_ns"};
  for (std::size_t i = 0; i < 7; ++i)
    H5Tinsert(t.get(), names[i], HOFFSET(StageRowT, ns) + i * sizeof(std::int64_t),
              H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "graph", HOFFSET(StageRowT, graph), H5T_NATIVE_UINT8);
  hsize_t n = rows.size();
  H5Handle sp(H5Screate_simple(1, &n, nullptr));
  H5Handle ds(
      H5Dcreate2(h, "/trace/stages", t.get(), sp.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (n > 0) H5Dwrite(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data());
}

// The per-stage timings travel through the export (summarize aligns on them): a cpu run's stages
// have host times and no device ones; exports written before /trace/stages read with no stages;
// damaged rows are rejected, never reordered or guessed.
TEST(ExportReaderCorpus, StageTimings) {
  {
    auto reader = OpenOk(F32().path);
    ASSERT_TRUE(reader);
    const auto& ws = reader->meta().windows;
    ASSERT_FALSE(ws.empty());
    for (const WindowRecord& w : ws) {
      ASSERT_EQ(w.stages.size(), 4u) << "window " << w.idx;
      for (const StageTiming& st : w.stages) {
        EXPECT_GT(st.compute_ns, 0);
        EXPECT_EQ(st.dev_compute_ns, -1);
        EXPECT_EQ(st.init_ns, -1);
        EXPECT_EQ(st.graph, GraphUse::kNone);
      }
    }
  }
  {
    auto reader =
        OpenOk(Mutated("nostages", [](hid_t h) { H5Ldelete(h, "/trace/stages", H5P_DEFAULT); }));
    ASSERT_TRUE(reader);
    for (const WindowRecord& w : reader->meta().windows) EXPECT_TRUE(w.stages.empty());
  }
  const StageRowT dev0{0, 0, {1, 2, 3, 40, 500, 6, 7}, 3}, dev1{0, 1, {1, 2, 3, -1, 5, 0, 0}, 2};
  {
    auto reader = OpenOk(Mutated("devstages", [&](hid_t h) { WriteStageRows(h, {dev0, dev1}); }));
    ASSERT_TRUE(reader);
    const auto& w0 = reader->meta().windows[0];
    ASSERT_EQ(w0.stages.size(), 2u);
    EXPECT_EQ(w0.stages[0].dev_wait_ns, 40);
    EXPECT_EQ(w0.stages[0].dev_compute_ns, 500);
    EXPECT_EQ(w0.stages[0].init_ns, 7);
    EXPECT_EQ(w0.stages[0].graph, GraphUse::kReplay);
    EXPECT_EQ(w0.stages[1].dev_wait_ns, -1);
    EXPECT_EQ(w0.stages[1].graph, GraphUse::kCapture);
    EXPECT_TRUE(reader->meta().windows[1].stages.empty());
  }
  auto with = [&](StageRowT r) {
    r.window = 0, r.stage = 0;
    return r;
  };
  StageRowT bad_graph = with(dev0), bad_dev = with(dev0), bad_host = with(dev0), far = dev0;
  bad_graph.graph = 9;
  bad_dev.ns[4] = -5;
  bad_host.ns[1] = -1;
  far.window = 100000;
  ExpectRejected(Mutated("stage-order",
                         [&](hid_t h) {
                           WriteStageRows(h, {dev1, dev0});
                         }),
                 "/trace/stages row 0: out of order");
  ExpectRejected(Mutated("stage-gap",
                         [&](hid_t h) {
                           WriteStageRows(h, {dev0, dev0});
                         }),
                 "/trace/stages row 1: out of order");
  ExpectRejected(Mutated("stage-graph", [&](hid_t h) { WriteStageRows(h, {bad_graph}); }),
                 "graph 9");
  ExpectRejected(Mutated("stage-dev", [&](hid_t h) { WriteStageRows(h, {bad_dev}); }),
                 "dev_compute_ns below -1");
  ExpectRejected(Mutated("stage-host", [&](hid_t h) { WriteStageRows(h, {bad_host}); }),
                 "negative compute_ns");
  ExpectRejected(Mutated("stage-window", [&](hid_t h) { WriteStageRows(h, {far}); }),
                 "window 100000 is not one of the");
}

TEST(ExportReaderCorpus, MissingOrMistypedStructure) {
  ExpectRejected(Mutated("nowindows", [](hid_t h) { H5Ldelete(h, "/trace/windows", H5P_DEFAULT); }),
                 "/trace/windows");
  ExpectRejected(Mutated("noconfig", [](hid_t h) { H5Ldelete(h, "/config", H5P_DEFAULT); }),
                 "/config: missing");
  ExpectRejected(Mutated("norunid", [](hid_t h) { H5Adelete(h, "run_id"); }),
                 "missing attribute 'run_id'");
  ExpectRejected(Mutated("counters",
                         [](hid_t h) {
                           H5Ldelete(h, "/counters/stage2", H5P_DEFAULT);
                           SetInt(h, "/counters", "x", 1);
                           H5Handle g(H5Gcreate2(h, "/counters/stage2", H5P_DEFAULT, H5P_DEFAULT,
                                                 H5P_DEFAULT));
                         }),
                 "/counters/stage2: missing attribute 'expert_hits'");
  // /trace/windows without export_ns.
  ExpectRejected(Mutated("compound",
                         [](hid_t h) {
                           H5Ldelete(h, "/trace/windows", H5P_DEFAULT);
                           struct Row {
                             std::int32_t idx, p, T;
                           };
                           H5Handle t(H5Tcreate(H5T_COMPOUND, sizeof(Row)));
                           H5Tinsert(t.get(), "idx", HOFFSET(Row, idx), H5T_NATIVE_INT32);
                           H5Tinsert(t.get(), "p", HOFFSET(Row, p), H5T_NATIVE_INT32);
                           H5Tinsert(t.get(), "T", HOFFSET(Row, T), H5T_NATIVE_INT32);
                           hsize_t n = 1;
                           H5Handle sp(H5Screate_simple(1, &n, nullptr));
                           H5Handle ds(H5Dcreate2(h, "/trace/windows", t.get(), sp.get(),
                                                  H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
                           Row r{0, 1, 1};
                           H5Dwrite(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &r);
                         }),
                 "/trace/windows: compound has no field 'T_mtp'");
  // Token ids stored as floats.
  ExpectRejected(Mutated("tokens",
                         [](hid_t h) {
                           H5Ldelete(h, "/request/tokens", H5P_DEFAULT);
                           hsize_t n = 3;
                           const float v[3] = {1, 2, 3};
                           H5Handle sp(H5Screate_simple(1, &n, nullptr));
                           H5Handle ds(H5Dcreate2(h, "/request/tokens", H5T_IEEE_F32LE, sp.get(),
                                                  H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
                           H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
                         }),
                 "/request/tokens: holds 4-byte floats, expected int32 token ids");
  // Links that point elsewhere.
  ExpectRejected(Mutated("soft",
                         [](hid_t h) {
                           H5Lcreate_soft("/checkpoints/00000_commit/stage1/layer3/k", h,
                                          "/checkpoints/00001_commit/stage1/layer3/k_copy",
                                          H5P_DEFAULT, H5P_DEFAULT);
                         }),
                 "/checkpoints/00001_commit/stage1/layer3/k_copy: is a soft or external link");
  ExpectRejected(Mutated("junk",
                         [](hid_t h) {
                           H5Handle g(H5Gcreate2(h, "/checkpoints/00001_commit/stage1/junk",
                                                 H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
                         }),
                 "/checkpoints/00001_commit/stage1/junk: unexpected entry");
  ExpectRejected(
      Mutated("point",
              [](hid_t h) { SetStr(h, "/checkpoints/00001_commit", "point", "pre_verify"); }),
      "/checkpoints/00001_commit: attributes window 1, point 'pre_verify' do not match");
}

TEST(ExportReaderCorpus, ItemAttributesAndShapes) {
  ExpectRejected(Mutated("valid_rows", [](hid_t h) { SetInt(h, kK, "valid_rows", 3); }),
                 kK + ": valid_rows attribute 3");
  ExpectRejected(
      Mutated("absurd_rows", [](hid_t h) { SetInt(h, kK, "valid_rows", std::int64_t{1} << 62); }),
      kK + ": valid_rows attribute 4611686018427387904");
  ExpectRejected(Mutated("capacity", [](hid_t h) { SetInt(h, kK, "capacity_rows", 1); }),
                 kK + ": capacity_rows 1");
  ExpectRejected(Mutated("no_valid_rows",
                         [](hid_t h) {
                           H5Handle o(H5Oopen(h, kK.c_str(), H5P_DEFAULT));
                           H5Adelete(o.get(), "valid_rows");
                         }),
                 kK + ": missing attribute 'valid_rows'");
  ExpectRejected(Mutated("dtype", [](hid_t h) { SetStr(h, kK, "dtype", "int8"); }),
                 kK + ": dtype attribute 'int8' but the dataset holds 4-byte floats");
  ExpectRejected(Mutated("dtype2", [](hid_t h) { SetStr(h, kK, "dtype", "f64"); }),
                 kK + ": unknown dtype attribute 'f64'");
  ExpectRejected(Mutated("kind", [](hid_t h) { SetStr(h, kK, "kind", "v"); }),
                 kK + ": kind attribute 'v' but the path says 'k'");
  ExpectRejected(Mutated("layer", [](hid_t h) { SetInt(h, kK, "layer", 4); }),
                 kK + ": stage/layer attributes 1/4");
  // Dims of 2^40 rows (never written: late allocation) hit max_dim; 2^28 rows fit max_dim but
  // their 2^36 bytes exceed the file's length.
  ExpectRejected(Mutated("huge",
                         [](hid_t h) {
                           ReplaceWithUnwritten(h, kK, {hsize_t{1} << 40, 2, 32});
                         }),
                 kK + ": dimension 0 is 1099511627776");
  ExpectRejected(Mutated("big",
                         [](hid_t h) {
                           ReplaceWithUnwritten(h, kK, {hsize_t{1} << 28, 2, 32});
                         }),
                 kK + ": shape [268435456, 2, 32] of f32 is larger than");
  // int8 scales that do not fit their item.
  const std::string ks = kK + "_scale";
  ExpectRejected(Mutated(
                     "scale",
                     [&](hid_t h) {
                       H5Ldelete(h, ks.c_str(), H5P_DEFAULT);
                       hsize_t dims[2] = {2, 5};
                       H5Handle sp(H5Screate_simple(2, dims, nullptr));
                       H5Handle ds(H5Dcreate2(h, ks.c_str(), H5T_IEEE_F32LE, sp.get(), H5P_DEFAULT,
                                              H5P_DEFAULT, H5P_DEFAULT));
                     },
                     Int8().path),
                 ks + ": scale shape [2, 5] does not fit");
}

// Kind names are checked against their place in the path grammar: a layer holds only layer kinds,
// mtp/ only k and v, the stage itself only hidden_out and logits; kind attributes are the exact
// spelling.
TEST(ExportReaderCorpus, KindsOutsideTheirPlaceAreRejected) {
  const std::string cp = "/checkpoints/00001_commit/stage1";
  auto link_k_as = [](const std::string& dst) {
    return [dst](hid_t h) {
      H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE));
      H5Pset_create_intermediate_group(lcpl.get(), 1);
      ASSERT_GE(H5Lcreate_hard(h, kK.c_str(), h, dst.c_str(), lcpl.get(), H5P_DEFAULT), 0) << dst;
    };
  };
  ExpectRejected(Mutated("layer_hidden", link_k_as(cp + "/layer3/hidden_out")),
                 cp + "/layer3/hidden_out: unexpected entry (not an item of lockstep.export v1)");
  ExpectRejected(Mutated("layer_mtp_k", link_k_as(cp + "/layer3/mtp_k")),
                 cp + "/layer3/mtp_k: unexpected entry (not an item of lockstep.export v1)");
  ExpectRejected(Mutated("mtp_conv", link_k_as(cp + "/mtp/conv_state")),
                 cp + "/mtp/conv_state: unexpected entry (not an item of lockstep.export v1)");
  ExpectRejected(Mutated("stage_kspec", link_k_as(cp + "/k_spec")),
                 cp + "/k_spec: unexpected entry (expected layer{L}, mtp, hidden_out or logits)");
  ExpectRejected(Mutated("kind_case", [](hid_t h) { SetStr(h, kK, "kind", "K"); }),
                 kK + ": kind attribute 'K' but the path says 'k'");
}

TEST(ExportReaderCorpus, Limits) {
  ReaderLimits l;
  l.max_items = 5;
  ExpectRejected(F32().path, "more than the limit of 5", l);
  l = {};
  l.max_windows = 2;
  ExpectRejected(F32().path, "/trace/windows: holds more than the limit of 2 rows", l);
  l = {};
  l.max_string_bytes = 20;
  ExpectRejected(F32().path, "exceeds the limit of 20", l);
  l = {};
  l.max_rank = 2;
  ExpectRejected(F32().path, "rank 3 exceeds the limit of 2", l);
  l = {};
  l.max_tokens = 2;
  ExpectRejected(F32().path, "/request/tokens", l);
  l = {};
  l.max_item_bytes = 100;
  ExpectRejected(F32().path, "is larger than the limit of 100 bytes", l);
}

// ---- (c) layouts the exporter never writes: the H5Dread fallback ----

// Rewrites the dataset at `path` (f32) with `file_type` and `dcpl`, same values and attributes.
void Rewrite(hid_t f, const std::string& path, hid_t file_type, hid_t dcpl) {
  H5Handle ds(H5Dopen2(f, path.c_str(), H5P_DEFAULT));
  H5Handle sp(H5Dget_space(ds.get()));
  std::vector<float> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(sp.get())));
  ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  std::int64_t stage = 0, layer = 0, valid = 0, cap = 0;
  for (auto [name, out] : {std::pair<const char*, std::int64_t*>{"stage", &stage},
                           {"layer", &layer},
                           {"valid_rows", &valid},
                           {"capacity_rows", &cap}}) {
    H5Handle a(H5Aopen(ds.get(), name, H5P_DEFAULT));
    H5Aread(a.get(), H5T_NATIVE_INT64, out);
  }
  char kind[32] = {};
  {
    H5Handle a(H5Aopen(ds.get(), "kind", H5P_DEFAULT));
    H5Handle t(H5Aget_type(a.get()));
    ASSERT_LT(H5Tget_size(t.get()), sizeof(kind));
    H5Aread(a.get(), t.get(), kind);
  }
  ds.reset();
  ASSERT_GE(H5Ldelete(f, path.c_str(), H5P_DEFAULT), 0);
  H5Handle nd(H5Dcreate2(f, path.c_str(), file_type, sp.get(), H5P_DEFAULT, dcpl, H5P_DEFAULT));
  ASSERT_TRUE(nd.valid());
  ASSERT_GE(H5Dwrite(nd.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  nd.reset();
  SetStr(f, path, "kind", kind);
  SetInt(f, path, "stage", stage);
  SetInt(f, path, "layer", layer);
  SetInt(f, path, "valid_rows", valid);
  SetInt(f, path, "capacity_rows", cap);
  SetStr(f, path, "dtype", "f32");
}

TEST(ExportReader, ChunkedDeflateAndBigEndianUseTheFallback) {
  const std::string logits = "/checkpoints/00001_post_verify/stage3/logits";
  const std::string be = "/checkpoints/00002_commit/stage0/layer0/ssm_state";
  const std::string file = Mutated("chunked", [&](hid_t h) {
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
    hsize_t chunk[3] = {2, 1, 16};
    H5Pset_chunk(dcpl.get(), 3, chunk);
    H5Pset_deflate(dcpl.get(), 4);
    Rewrite(h, kK, H5T_IEEE_F32LE, dcpl.get());
    H5Handle dcpl2(H5Pcreate(H5P_DATASET_CREATE));
    hsize_t chunk2[2] = {1, 7};
    H5Pset_chunk(dcpl2.get(), 2, chunk2);
    H5Pset_deflate(dcpl2.get(), 1);
    Rewrite(h, logits, H5T_IEEE_F32LE, dcpl2.get());
    Rewrite(h, be, H5T_IEEE_F32BE, H5P_DEFAULT);
  });
  auto reader = OpenOk(file);
  auto plain = OpenOk(F32().path);
  ASSERT_TRUE(reader && plain);
  ASSERT_EQ(reader->meta().checkpoints.size(), plain->meta().checkpoints.size());
  int checked = 0;
  for (std::size_t c = 0; c < reader->meta().checkpoints.size(); ++c) {
    const auto &cp = reader->meta().checkpoints[c], &pcp = plain->meta().checkpoints[c];
    ASSERT_EQ(cp.items.size(), pcp.items.size());
    for (std::size_t i = 0; i < cp.items.size(); ++i) {
      const std::string p = ItemPath(cp, cp.items[i]);
      const auto want = ReadAllRows(*plain, pcp, pcp.items[i]);
      EXPECT_EQ(ReadAllRows(*reader, cp, cp.items[i]), want) << p;
      EXPECT_EQ(ReadAllRows(*reader, cp, cp.items[i], 3), want) << p << " in blocks of 3 rows";
      const bool rewritten = p == kK || p == logits || p == be;
      EXPECT_EQ(reader->ReadsDirectly(cp, cp.items[i]), !rewritten) << p;
      checked += rewritten;
    }
  }
  EXPECT_EQ(checked, 3);
  // The fallback is serialised but safe from several threads.
  const auto& cp = reader->meta().checkpoints[5];  // 00001_commit
  ASSERT_EQ(cp.name, "00001_commit");
  auto it = std::find_if(cp.items.begin(), cp.items.end(),
                         [](const ExportItem& x) { return x.rel == "stage1/layer3/k"; });
  ASSERT_NE(it, cp.items.end());
  ASSERT_GT(it->rows(), 4);
  const auto want = H5Whole(file, kK, H5T_NATIVE_FLOAT);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        if (ReadAllRows(*reader, cp, *it, 1 + (rep + t) % 4) != want) ++bad;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// The isolated reader decompresses chunked items into a spill file: their rows in all are checked
// against the spill bound (spill_factor x the file + slack) before a byte is written, so a small
// file claiming huge chunks costs nothing (issue 43; a 10 MB file once took a 1.5 GB spill).
TEST(ExportReader, ChunkedRowsPastTheSpillBoundAreRefusedBeforeDecompressing) {
  const std::string file = Mutated("spill_bound", [&](hid_t h) {
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
    hsize_t chunk[3] = {2, 1, 16};
    H5Pset_chunk(dcpl.get(), 3, chunk);
    H5Pset_deflate(dcpl.get(), 4);
    Rewrite(h, kK, H5T_IEEE_F32LE, dcpl.get());
  });
  const auto k_bytes = static_cast<std::int64_t>(H5Whole(file, kK, H5T_NATIVE_FLOAT).size());
  ASSERT_GT(k_bytes, 0);
  ReaderLimits l;
  l.spill_factor = 0;
  l.spill_slack_bytes = k_bytes - 1;  // one byte short of the one chunked item
  ExpectRejected(file, "more than the spill bound of " + std::to_string(k_bytes - 1), l);
  l.spill_slack_bytes = k_bytes;  // exactly enough
  auto r = ExportReader::Open(file, l);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(OpenOk(file)) << "the default bound holds a file as the exporter writes it";
}

TEST(ExportReader, WindowsReadByFieldNameAndUnknownTimings) {
  auto plain = OpenOk(F32().path);
  ASSERT_TRUE(plain);
  const std::vector<WindowRecord>& ws = plain->meta().windows;
  ASSERT_GE(ws.size(), 3u);
  // /trace/windows rewritten with the fields in reverse order, an extra field first, int64
  // everywhere, and export_ns unknown (-1) in windows 0 and 2.
  const std::string file = Mutated("reordered", [&](hid_t h) {
    ASSERT_GE(H5Ldelete(h, "/trace/windows", H5P_DEFAULT), 0);
    const char* names[18] = {"extra",   "export_ns",  "commit_ns", "draft_ns", "compute_ns",
                             "wait_ns", "verify_ns",  "end_ns",    "begin_ns", "accepted",
                             "chain_n", "first_call", "from_sfx",  "merged",   "T_mtp",
                             "T",       "p",          "idx"};
    using Row = std::array<std::int64_t, 18>;
    H5Handle t(H5Tcreate(H5T_COMPOUND, sizeof(Row)));
    for (std::size_t i = 0; i < 18; ++i) H5Tinsert(t.get(), names[i], i * 8, H5T_STD_I64LE);
    std::vector<Row> rows;
    for (const WindowRecord& w : ws) {
      rows.push_back({42, w.idx % 2 == 0 && w.idx <= 2 ? -1 : w.export_ns, w.commit_ns, w.draft_ns,
                      w.compute_ns, w.wait_ns, w.verify_ns, w.end_ns, w.begin_ns, w.accepted,
                      w.chain_n, w.first_call, w.from_sfx, w.merged, w.T_mtp, w.T, w.p, w.idx});
    }
    hsize_t n = rows.size();
    H5Handle sp(H5Screate_simple(1, &n, nullptr));
    H5Handle ds(
        H5Dcreate2(h, "/trace/windows", t.get(), sp.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Dwrite(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()), 0);
  });
  auto reader = OpenOk(file);
  ASSERT_TRUE(reader);
  const ExportMeta& m = reader->meta();
  ASSERT_EQ(m.windows.size(), ws.size());
  for (std::size_t i = 0; i < ws.size(); ++i) {
    EXPECT_TRUE(m.windows[i].SamePath(ws[i])) << i;
    EXPECT_EQ(m.windows[i].accepted, ws[i].accepted);
    EXPECT_EQ(m.windows[i].first_call, ws[i].first_call);
    EXPECT_EQ(m.windows[i].begin_ns, ws[i].begin_ns);
    EXPECT_EQ(m.windows[i].export_ns, i == 0 || i == 2 ? -1 : ws[i].export_ns);
  }
  const std::string line =
      "trace/windows export_ns: unknown in 2 of " + std::to_string(ws.size()) + " windows";
  EXPECT_NE(std::find(m.unknowns.begin(), m.unknowns.end(), line), m.unknowns.end()) << line;
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// ---- /index/items: the fast path gives what the full walk gives, and a bad index is an error ----

TEST(ExportReaderIndex, IndexAndFullWalkAgree) {
  for (const Generated* g : {&F32(), &Int8(), &Bf16()}) {
    auto fast = OpenOk(g->path);
    ReaderLimits walk_limits;
    walk_limits.use_index = false;
    auto walk = OpenOk(g->path, walk_limits);
    const auto& a = fast->meta().checkpoints;
    const auto& b = walk->meta().checkpoints;
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t c = 0; c < a.size(); ++c) {
      EXPECT_EQ(a[c].name, b[c].name);
      EXPECT_EQ(a[c].p, b[c].p);
      ASSERT_EQ(a[c].items.size(), b[c].items.size()) << a[c].name;
      for (std::size_t i = 0; i < a[c].items.size(); ++i) {
        const ExportItem& x = a[c].items[i];
        const ExportItem& y = b[c].items[i];
        EXPECT_EQ(x.rel, y.rel);
        EXPECT_EQ(x.kind, y.kind);
        EXPECT_EQ(x.dtype, y.dtype);
        EXPECT_EQ(x.shape, y.shape);
        EXPECT_EQ(x.capacity_rows, y.capacity_rows);
        EXPECT_EQ(x.has_scales, y.has_scales);
        EXPECT_EQ(ReadAllRows(*fast, a[c], x), ReadAllRows(*walk, b[c], y))
            << a[c].name << "/" << x.rel;
      }
    }
  }
}

TEST(ExportReaderIndex, StaleOrForeignIndexIsRejected) {
  // A checkpoint the index names but the file no longer holds.
  ExpectRejected(
      Mutated(
          "index-missing-cp",
          [](hid_t f) { EXPECT_GE(H5Ldelete(f, "/checkpoints/00000_commit", H5P_DEFAULT), 0); }, "",
          /*keep_index=*/true),
      "which /checkpoints does not hold");
  // Datasets swapped under an unchanged index: the cross-check of the first item catches it.
  auto swapped = Mutated(
      "index-swapped",
      [](hid_t f) {
        const std::string d = "/checkpoints/00000_pre_verify/stage0/layer0/";
        EXPECT_GE(H5Lmove(f, (d + "conv_state").c_str(), f, (d + "tmp").c_str(), H5P_DEFAULT,
                          H5P_DEFAULT),
                  0);
        EXPECT_GE(H5Lmove(f, (d + "ssm_state").c_str(), f, (d + "conv_state").c_str(), H5P_DEFAULT,
                          H5P_DEFAULT),
                  0);
        EXPECT_GE(
            H5Lmove(f, (d + "tmp").c_str(), f, (d + "ssm_state").c_str(), H5P_DEFAULT, H5P_DEFAULT),
            0);
      },
      "", /*keep_index=*/true);
  auto r = ExportReader::Open(swapped);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().exit_code(), 2) << r.status().message();
  // With the index off the same file is read by the full walk, which also rejects it (kind
  // attributes).
  ReaderLimits walk;
  walk.use_index = false;
  EXPECT_FALSE(ExportReader::Open(swapped, walk).ok());
}

}  // namespace
}  // namespace lockstep
