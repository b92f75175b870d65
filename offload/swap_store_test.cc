#include "offload/swap_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/errors.h"
#include "offload/block_device.h"
#include "offload/fused_adam.h"
#include "offload/posix_block_device.h"
#include "offload/faulty_block_device.h"
#include "offload/memory_block_device.h"

namespace zerostep {
namespace {

// Comparisons are bitwise (memcmp): the store moves bytes and must never
// change one.
using State = std::vector<std::vector<float>>;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

State random_state(size_t k, uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  State s(k, std::vector<float>(n));
  for (auto& a : s) {
    for (float& x : a) x = u(rng);
  }
  return s;
}

// The test's "optimizer step": a deterministic function of the old value,
// the array and the element index.
float step_value(float old, size_t k, uint64_t i) {
  return old * 0.75f + 0.125f * static_cast<float>(k + 1) +
         0.01f * static_cast<float>(i % 7);
}

void step_fn(const SwapSubgroup& s) {
  for (size_t k = 0; k < s.num_arrays; ++k) {
    for (size_t j = 0; j < s.count; ++j) {
      s.arrays[k][j] = step_value(s.arrays[k][j], k, s.first + j);
    }
  }
}

State stepped(State s) {
  for (size_t k = 0; k < s.size(); ++k) {
    for (size_t i = 0; i < s[k].size(); ++i)
      s[k][i] = step_value(s[k][i], k, i);
  }
  return s;
}

bool same_bits(const State& a, const State& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].size() != b[k].size()) return false;
    if (std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(float)) !=
        0) {
      return false;
    }
  }
  return true;
}

std::vector<const float*> const_ptrs(const State& s) {
  std::vector<const float*> p;
  for (const auto& a : s) p.push_back(a.data());
  return p;
}

void write_state(SwapStore& store, const State& s) {
  store.write_arrays(const_ptrs(s).data());
}

State read_state(SwapStore& store) {
  State s(store.options().num_arrays,
          std::vector<float>(store.options().numel));
  std::vector<float*> p;
  for (auto& a : s) p.push_back(a.data());
  store.read_arrays(p.data());
  return s;
}

// 4 sub-groups (the last one short) of 3 arrays; each slot is 20480 bytes
// moved in 5 operations of 4096, so an update pass is 20 reads, 21 writes
// (20 slot pieces and the record) and 2 flushes.
SwapStoreOptions small_options() {
  SwapStoreOptions o;
  o.num_arrays = 3;
  o.numel = 5000;
  o.subgroup_numel = 1500;
  o.buffer_count = 3;
  o.io_chunk_bytes = kBlockAlign;
  return o;
}
constexpr uint64_t kReadsPerPass = 20;
constexpr uint64_t kWritesPerPass = 21;
constexpr uint64_t kFlushesPerPass = 2;

std::string make_temp_dir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/swap.XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) std::abort();
  return buf.data();
}

// ----- Round trips -----------------------------------------------------

TEST(SwapStoreTest, RoundTripsOverManyGeometries) {
  struct Geometry {
    size_t k;
    uint64_t n;
    size_t subgroup, buffers, chunk;
  };
  const Geometry geometries[] = {
      {1, 1, 1, 2, kBlockAlign},             // one element
      {3, 5000, 1500, 3, kBlockAlign},       // short last sub-group
      {2, 4096, 4096, 2, 8 << 20},           // one sub-group, one chunk
      {3, 10000, 1000, 5, 2 * kBlockAlign},  // deep read-ahead
      {2, 100, 1000, 3, kBlockAlign},        // sub-group larger than n
      {4, 3000, 7, 4, kBlockAlign},          // many tiny sub-groups
  };
  for (const Geometry& g : geometries) {
    SCOPED_TRACE("k=" + std::to_string(g.k) + " n=" + std::to_string(g.n) +
                 " subgroup=" + std::to_string(g.subgroup) +
                 " buffers=" + std::to_string(g.buffers));
    SwapStoreOptions o;
    o.num_arrays = g.k;
    o.numel = g.n;
    o.subgroup_numel = g.subgroup;
    o.buffer_count = g.buffers;
    o.io_chunk_bytes = g.chunk;
    MemoryBlockDevice dev("/sim/rank0.swap");
    State want = random_state(g.k, g.n, g.n);
    {
      SwapStore store(&dev, o);
      EXPECT_FALSE(store.has_state());
      EXPECT_EQ(dev.size(), store.device_bytes());
      write_state(store, want);
      EXPECT_EQ(store.generation(), 1u);
      EXPECT_TRUE(same_bits(read_state(store), want));
      for (int step = 0; step < 3; ++step) {
        store.update(step_fn);
        want = stepped(want);
        const SwapPassStats& st = store.last_pass_stats();
        EXPECT_EQ(st.bytes_read, store.num_subgroups() * store.slot_bytes());
        EXPECT_EQ(st.bytes_written,
                  store.num_subgroups() * store.slot_bytes() + kBlockAlign);
        EXPECT_GE(st.seconds, st.function_seconds);
      }
      EXPECT_EQ(store.generation(), 4u);
      EXPECT_TRUE(same_bits(read_state(store), want));
      EXPECT_EQ(dev.in_flight(), 0u);
    }
    SwapStore reopened(&dev, o);
    EXPECT_EQ(reopened.generation(), 4u);
    EXPECT_TRUE(same_bits(read_state(reopened), want));
  }
}

TEST(SwapStoreTest, SubgroupsArriveInOrderWithTheirRanges) {
  MemoryBlockDevice dev("m");
  SwapStore store(&dev, small_options());
  EXPECT_EQ(store.num_subgroups(), 4u);
  EXPECT_EQ(store.slot_bytes(), 20480u);
  EXPECT_EQ(store.buffer_bytes(), 3u * 20480);
  EXPECT_EQ(store.device_bytes(), 8192u + 2 * 4 * 20480);
  std::vector<std::pair<uint64_t, size_t>> seen;
  store.write_all([&](const SwapSubgroup& s) {
    EXPECT_EQ(s.index, seen.size());
    EXPECT_EQ(s.num_arrays, 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(s.arrays[k]) % 64, 0u);
      for (size_t j = 0; j < s.count; ++j) {
        EXPECT_EQ(s.arrays[k][j], 0.0f);  // zeroed for write_all
        s.arrays[k][j] = static_cast<float>(k * 100000 + s.first + j);
      }
    }
    seen.emplace_back(s.first, s.count);
  });
  const std::vector<std::pair<uint64_t, size_t>> want = {
      {0, 1500}, {1500, 1500}, {3000, 1500}, {4500, 500}};
  EXPECT_EQ(seen, want);
  store.read_all([&](const SwapSubgroupView& s) {
    for (size_t k = 0; k < 3; ++k) {
      for (size_t j = 0; j < s.count; ++j) {
        ASSERT_EQ(s.arrays[k][j], static_cast<float>(k * 100000 + s.first + j));
      }
    }
  });
}

// ----- Pipelining --------------------------------------------------------

// Logs every submission and wait, by slot, around a memory device.
class RecordingDevice final : public BlockDevice {
 public:
  struct Event {
    char what;  // 'r'/'w' submitted, 'R'/'W' waited, 'F' function ran
    uint64_t offset;
  };
  RecordingDevice(BlockDevice* inner, std::vector<Event>* log)
      : inner_(inner), log_(log) {}
  const std::string& name() const override { return inner_->name(); }
  uint64_t size() const override { return inner_->size(); }
  void reserve(uint64_t bytes) override { inner_->reserve(bytes); }
  IoTicket submit_read(uint64_t offset, void* buffer, size_t size) override {
    log_->push_back({'r', offset});
    const IoTicket t = inner_->submit_read(offset, buffer, size);
    ops_[t] = {'R', offset};
    return t;
  }
  IoTicket submit_write(uint64_t offset, const void* buffer,
                        size_t size) override {
    log_->push_back({'w', offset});
    const IoTicket t = inner_->submit_write(offset, buffer, size);
    ops_[t] = {'W', offset};
    return t;
  }
  bool poll(IoTicket t) override { return inner_->poll(t); }
  void wait(IoTicket t) override {
    inner_->wait(t);
    log_->push_back(ops_.at(t));
  }
  void flush() override { inner_->flush(); }
  size_t in_flight() const override { return inner_->in_flight(); }

 private:
  BlockDevice* inner_;
  std::vector<Event>* log_;
  std::map<IoTicket, Event> ops_;
};

// With 3 buffers, while the function updates sub-group g the read of g + 1
// has been submitted and the write of g - 1 is still in flight; with 2, the
// read of g + 1 is.
TEST(SwapStoreTest, ReadAheadAndWriteBackOverlapTheFunction) {
  for (size_t buffers : {2, 3}) {
    SCOPED_TRACE("buffer_count=" + std::to_string(buffers));
    MemoryBlockDevice medium("m");
    std::vector<RecordingDevice::Event> log;
    RecordingDevice dev(&medium, &log);
    SwapStoreOptions o;
    o.num_arrays = 2;
    o.numel = 6 * 1000;
    o.subgroup_numel = 1000;
    o.buffer_count = buffers;
    o.io_chunk_bytes = 1 << 20;  // one operation per slot
    SwapStore store(&dev, o);
    write_state(store, random_state(2, o.numel, 1));
    log.clear();
    store.update([&](const SwapSubgroup& s) {
      log.push_back({'F', s.index});
      step_fn(s);
    });
    const size_t groups = store.num_subgroups();
    auto subgroup_of = [&](uint64_t offset) {
      return static_cast<size_t>((offset - 8192) / store.slot_bytes() % groups);
    };
    auto find = [&](char what, size_t g, size_t from) {
      for (size_t i = from; i < log.size(); ++i) {
        if (log[i].what != what) continue;
        if (what == 'F'
                ? log[i].offset == g
                : (log[i].offset >= 8192 && subgroup_of(log[i].offset) == g)) {
          return i;
        }
      }
      return log.size();
    };
    for (size_t g = 0; g < groups; ++g) {
      const size_t f = find('F', g, 0);
      ASSERT_LT(f, log.size());
      if (g + 1 < groups) {
        EXPECT_LT(find('r', g + 1, 0), f) << "read of " << g + 1;
      }
      if (g >= 1) {
        EXPECT_LT(find('w', g - 1, 0), f) << "write of " << g - 1;
        if (buffers == 3) {
          EXPECT_GT(find('W', g - 1, 0), f) << "write of " << g - 1;
        }
      }
    }
  }
}

// ----- States and errors without faults ----------------------------------

TEST(SwapStoreTest, EmptyDeviceHasNoState) {
  MemoryBlockDevice dev("/nvme/rank1.swap");
  SwapStore store(&dev, small_options());
  EXPECT_FALSE(store.has_state());
  EXPECT_EQ(store.generation(), 0u);
  EXPECT_THROW(store.update(step_fn), UsageError);
  EXPECT_THROW(store.read_all([](const SwapSubgroupView&) {}), UsageError);
  // Reopening a device whose first write_all never committed: still empty.
  SwapStore again(&dev, small_options());
  EXPECT_FALSE(again.has_state());
}

TEST(SwapStoreTest, InvalidOptionsAreUsageErrors) {
  MemoryBlockDevice dev("m");
  auto with = [&](auto edit) {
    SwapStoreOptions o = small_options();
    edit(o);
    return o;
  };
  EXPECT_THROW(SwapStore(&dev, with([](auto& o) { o.num_arrays = 0; })),
               UsageError);
  EXPECT_THROW(SwapStore(&dev, with([](auto& o) { o.num_arrays = 17; })),
               UsageError);
  EXPECT_THROW(SwapStore(&dev, with([](auto& o) { o.numel = 0; })), UsageError);
  EXPECT_THROW(SwapStore(&dev, with([](auto& o) { o.subgroup_numel = 0; })),
               UsageError);
  EXPECT_THROW(SwapStore(&dev, with([](auto& o) { o.buffer_count = 1; })),
               UsageError);
  EXPECT_THROW(SwapStore(&dev, with([](auto& o) { o.io_chunk_bytes = 1000; })),
               UsageError);
  EXPECT_THROW(SwapStore(nullptr, small_options()), UsageError);
  EXPECT_EQ(dev.size(), 0u);  // nothing reserved
}

TEST(SwapStoreTest, ReopeningWithAnotherGeometryIsRefused) {
  MemoryBlockDevice dev("/nvme/rank0.swap");
  {
    SwapStore store(&dev, small_options());
    write_state(store, random_state(3, 5000, 2));
  }
  SwapStoreOptions other = small_options();
  other.num_arrays = 2;
  try {
    SwapStore store(&dev, other);
    FAIL() << "opened a store of another geometry";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "/nvme/rank0.swap")) << e.what();
    EXPECT_TRUE(contains(e.what(), "num_arrays=3, numel=5000")) << e.what();
    EXPECT_TRUE(contains(e.what(), "asks for num_arrays=2")) << e.what();
    EXPECT_TRUE(contains(e.what(), "fresh nvme_path")) << e.what();
  }
}

TEST(SwapStoreTest, AThrowingFunctionChangesNothing) {
  MemoryBlockDevice dev("m");
  SwapStore store(&dev, small_options());
  const State s0 = random_state(3, 5000, 3);
  write_state(store, s0);
  struct Boom {};
  EXPECT_THROW(store.update([](const SwapSubgroup& s) {
    step_fn(s);
    if (s.index == 2) throw Boom();
  }),
               Boom);
  EXPECT_EQ(store.generation(), 1u);
  EXPECT_EQ(dev.in_flight(), 0u);
  EXPECT_TRUE(same_bits(read_state(store), s0));
  store.update(step_fn);
  EXPECT_TRUE(same_bits(read_state(store), stepped(s0)));
}

TEST(SwapStoreTest, CorruptedDataIsDetectedNotUsed) {
  MemoryBlockDevice dev("/nvme/rank0.swap");
  SwapStore store(&dev, small_options());
  const State s0 = random_state(3, 5000, 4);
  write_state(store, s0);  // generation 1: copy 1
  // Flip one bit of array 1, element 7 of sub-group 2, in copy 1.
  const uint64_t offset = 8192 + (1 * 4 + 2) * store.slot_bytes() + 6016 + 28;
  dev.medium()[offset] ^= 0x10;
  try {
    store.update(step_fn);
    FAIL() << "used corrupt data";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "corrupt sub-group 2")) << e.what();
    EXPECT_TRUE(contains(e.what(), "data checksum mismatch")) << e.what();
    EXPECT_TRUE(contains(e.what(), "/nvme/rank0.swap")) << e.what();
    EXPECT_TRUE(contains(e.what(), "keeps generation 1")) << e.what();
  }
  EXPECT_EQ(store.generation(), 1u);
  dev.medium()[offset] ^= 0x10;
  store.update(step_fn);
  EXPECT_TRUE(same_bits(read_state(store), stepped(s0)));
}

TEST(SwapStoreTest, AFullDeviceIsReportedAtConstructionNamingThePath) {
  MemoryBlockDevice dev("/nvme/job7/rank0.swap", 64 * 1024);
  try {
    SwapStore store(&dev, small_options());
    FAIL() << "no ENOSPC";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "/nvme/job7/rank0.swap")) << e.what();
    EXPECT_TRUE(contains(e.what(), "needs 172032 bytes")) << e.what();
    EXPECT_TRUE(contains(e.what(), "No space left on device")) << e.what();
    EXPECT_TRUE(contains(e.what(), "point nvme_path at a drive")) << e.what();
  }
}

// ----- Faults at every operation ----------------------------------------

struct FaultCase {
  OpKind op;
  IoFaultKind fault;
  uint64_t index;  // within the update pass
};

std::string describe(const FaultCase& c) {
  return std::string(op_kind_name(c.op)) + " #" + std::to_string(c.index) +
         " of the pass: " + io_fault_kind_name(c.fault);
}

std::vector<FaultCase> every_fault_of_a_pass() {
  const std::map<OpKind, uint64_t> per_pass = {
      {OpKind::kRead, kReadsPerPass},
      {OpKind::kWrite, kWritesPerPass},
      {OpKind::kFlush, kFlushesPerPass}};
  std::vector<FaultCase> cases;
  for (const auto& [op, n] : per_pass) {
    for (IoFaultKind f :
         {IoFaultKind::kIoError, IoFaultKind::kNoSpace, IoFaultKind::kShortWrite,
          IoFaultKind::kTornWrite, IoFaultKind::kCrash}) {
      if (!fault_applies(f, op)) continue;
      for (uint64_t i = 0; i < n; ++i) cases.push_back({op, f, i});
    }
  }
  return cases;
}

// Whether the fault hit the commit record's write or the flush after it:
// the one window in which a crash may come back at the new generation
// (Note [Swap pass atomicity]).
bool in_commit_window(const FaultCase& c) {
  return (c.op == OpKind::kWrite && c.index == kWritesPerPass - 1) ||
         (c.op == OpKind::kFlush && c.index == kFlushesPerPass - 1);
}

// A store at generation 2 (both copies used) over a fault injector.
struct Rig {
  explicit Rig(uint64_t seed)
      : medium("/nvme/rank0.swap"),
        s1(stepped(random_state(3, 5000, seed))),
        s2(stepped(s1)) {
    FaultyDeviceOptions o;
    o.seed = seed;
    device = std::make_unique<FaultyBlockDevice>(&medium, o);
    store = std::make_unique<SwapStore>(device.get(), small_options());
    write_state(*store, random_state(3, 5000, seed));
    store->update(step_fn);
  }
  MemoryBlockDevice medium;
  State s1, s2;  // the state at generation 2, and one step later
  std::unique_ptr<FaultyBlockDevice> device;
  std::unique_ptr<SwapStore> store;
};

// Every fault class at every operation of an update pass. The pass throws
// IoError naming the device; then
//  * without a crash, the same object reads the old state bit for bit and
//    its next pass gives exactly the new one (also after reopening), and a
//    reopen right after the failure finds the old state;
//  * after a crash, a reopen finds the old state bit for bit (or, only in
//    the commit window, exactly the new one), and a pass from there
//    succeeds.
TEST(SwapStoreTest, EveryFaultAtEveryOperationLeavesTheOldState) {
  const std::vector<FaultCase> cases = every_fault_of_a_pass();
  int crashes = 0, new_after_crash = 0;
  for (const FaultCase& c : cases) {
    const uint64_t seed = 1000 + (&c - cases.data());
    SCOPED_TRACE(describe(c) + ", seed " + std::to_string(seed));
    for (bool reopen_at_once : {false, true}) {
      Rig rig(seed);
      FaultyBlockDevice& dev = *rig.device;
      ASSERT_EQ(rig.store->generation(), 2u);
      dev.schedule(c.op, dev.count(c.op) + c.index, c.fault);
      try {
        rig.store->update(step_fn);
        FAIL() << "the pass survived " << dev.describe();
      } catch (const IoError& e) {
        EXPECT_TRUE(contains(e.what(),
                             "swap store on '/nvme/rank0.swap': "
                             "update (generation 2 -> 3) failed"))
            << e.what();
        EXPECT_TRUE(contains(e.what(), "keeps generation 2")) << e.what();
      }
      ASSERT_EQ(dev.injected().size(), 1u) << dev.describe();
      EXPECT_EQ(rig.store->generation(), 2u);
      EXPECT_EQ(dev.in_flight(), 0u);
      if (dev.crashed()) {
        ++crashes;
        rig.store.reset();  // the process died
        dev.restart();
        SwapStore reopened(&dev, small_options());
        const State got = read_state(reopened);
        if (reopened.generation() == 3) {
          ++new_after_crash;
          EXPECT_TRUE(in_commit_window(c));
          EXPECT_TRUE(same_bits(got, rig.s2));
        } else {
          EXPECT_EQ(reopened.generation(), 2u);
          EXPECT_TRUE(same_bits(got, rig.s1)) << "a mix after the crash";
          reopened.update(step_fn);
          EXPECT_TRUE(same_bits(read_state(reopened), rig.s2));
        }
        break;  // the crash case needs no second variant
      }
      if (reopen_at_once) {
        rig.store.reset();
        SwapStore reopened(&dev, small_options());
        EXPECT_EQ(reopened.generation(), 2u);
        EXPECT_TRUE(same_bits(read_state(reopened), rig.s1));
        continue;
      }
      EXPECT_TRUE(same_bits(read_state(*rig.store), rig.s1));
      rig.store->update(step_fn);
      EXPECT_EQ(rig.store->generation(), 3u);
      EXPECT_TRUE(same_bits(read_state(*rig.store), rig.s2));
      rig.store.reset();
      SwapStore reopened(&dev, small_options());
      EXPECT_EQ(reopened.generation(), 3u);
      EXPECT_TRUE(same_bits(read_state(reopened), rig.s2));
    }
  }
  std::printf("%zu fault cases, %d crashes, %d came back committed\n",
              cases.size(), crashes, new_after_crash);
  EXPECT_EQ(cases.size(), 20u * 2 + 21u * 5 + 2u * 3);
  EXPECT_GT(crashes, 40);
}

// Faults in write_all (the first commit) and at open.
TEST(SwapStoreTest, FaultsInTheFirstCommitLeaveNoState) {
  for (uint64_t i = 0; i < kWritesPerPass; ++i) {
    for (IoFaultKind f : {IoFaultKind::kIoError, IoFaultKind::kTornWrite}) {
      MemoryBlockDevice medium("m");
      FaultyBlockDevice dev(&medium);
      {
        SwapStore store(&dev, small_options());
        dev.schedule(OpKind::kWrite, dev.count(OpKind::kWrite) + i, f);
        EXPECT_THROW(write_state(store, random_state(3, 5000, i)), IoError);
        EXPECT_FALSE(store.has_state());
      }
      dev.restart();
      SwapStore reopened(&dev, small_options());
      if (i + 1 < kWritesPerPass) {
        EXPECT_FALSE(reopened.has_state()) << i;
      }
      const State s = random_state(3, 5000, 99);
      write_state(reopened, s);
      EXPECT_TRUE(same_bits(read_state(reopened), s));
    }
  }
  // The superblock read and the reservation at open.
  for (OpKind op : {OpKind::kRead, OpKind::kReserve}) {
    Rig rig(7);
    rig.store.reset();
    rig.device->schedule(op, rig.device->count(op), IoFaultKind::kIoError);
    try {
      SwapStore store(rig.device.get(), small_options());
      FAIL() << "opened through a fault";
    } catch (const IoError& e) {
      EXPECT_TRUE(
          contains(e.what(), "opening swap store on '/nvme/rank0.swap'"))
          << e.what();
    }
    SwapStore store(rig.device.get(), small_options());
    EXPECT_TRUE(same_bits(read_state(store), rig.s1));
  }
}

TEST(SwapStoreTest, NoSpaceDuringASwapNamesThePath) {
  Rig rig(5);
  rig.device->schedule(OpKind::kWrite, rig.device->count(OpKind::kWrite) + 3,
                       IoFaultKind::kNoSpace);
  try {
    rig.store->update(step_fn);
    FAIL() << "no ENOSPC";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m,
                         "update (generation 2 -> 3) failed at writing "
                         "sub-group 0 of 4"))
        << m;
    EXPECT_TRUE(contains(m, "write of 4096 bytes at offset")) << m;
    EXPECT_TRUE(contains(m,
                         "on '/nvme/rank0.swap' failed: No space left on "
                         "device"))
        << m;
    EXPECT_TRUE(contains(m, "free space on it or point nvme_path")) << m;
  }
}

// A failed flush after the record write: the drive may or may not hold the
// new record. The object stays at the old generation; its destructor or
// next pass takes the uncertain record back, so the device agrees.
TEST(SwapStoreTest, AnUncertainCommitIsResolved) {
  for (bool next_pass : {false, true}) {
    Rig rig(9);
    FaultyBlockDevice& dev = *rig.device;
    dev.schedule(OpKind::kFlush, dev.count(OpKind::kFlush) + 1,
                 IoFaultKind::kIoError);
    EXPECT_THROW(rig.store->update(step_fn), IoError);
    EXPECT_EQ(rig.store->generation(), 2u);
    {
      // What a crash right now would find: the new record did reach the
      // medium (indeterminate, and complete).
      SwapStore peek(&rig.medium, small_options());
      EXPECT_EQ(peek.generation(), 3u);
      EXPECT_TRUE(same_bits(read_state(peek), rig.s2));
    }
    if (next_pass) {
      rig.store->update(step_fn);  // from s1, not from s2
      EXPECT_EQ(rig.store->generation(), 3u);
      EXPECT_TRUE(same_bits(read_state(*rig.store), rig.s2));
    } else {
      rig.store.reset();
      SwapStore reopened(&dev, small_options());
      EXPECT_EQ(reopened.generation(), 2u);
      EXPECT_TRUE(same_bits(read_state(reopened), rig.s1));
    }
  }
}

// Seeded random faults of every class over many passes: whatever happens,
// the device holds one of the two states a pass goes between, bit for bit.
TEST(SwapStoreTest, RandomFaultsNeverLeaveAMix) {
  std::set<std::string> kinds;
  int passes = 0, failed = 0, indeterminate = 0;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    MemoryBlockDevice medium("/nvme/rank0.swap");
    State committed = random_state(3, 5000, seed);
    uint64_t generation = 1;
    {
      SwapStore store(&medium, small_options());
      write_state(store, committed);
    }
    FaultyDeviceOptions o;
    o.seed = seed;
    o.fault_probability = 0.03;
    FaultyBlockDevice dev(&medium, o);
    for (int attempt = 0; attempt < 6; ++attempt) {
      ++passes;
      const State next = stepped(committed);
      bool ok = false;
      try {
        SwapStore store(&dev, small_options());
        ASSERT_EQ(store.generation(), generation) << dev.describe();
        store.update(step_fn);
        ok = true;
      } catch (const IoError&) {
        ++failed;
      }
      if (dev.crashed()) dev.restart();
      SwapStore check(&medium, small_options());  // no faults
      const State got = read_state(check);
      if (ok || check.generation() == generation + 1) {
        if (!ok) ++indeterminate;
        ASSERT_EQ(check.generation(), generation + 1) << dev.describe();
        ASSERT_TRUE(same_bits(got, next)) << dev.describe();
        committed = next;
        ++generation;
      } else {
        ASSERT_EQ(check.generation(), generation) << dev.describe();
        ASSERT_TRUE(same_bits(got, committed)) << dev.describe();
      }
    }
    for (const InjectedFault& f : dev.injected()) {
      kinds.insert(std::string(op_kind_name(f.op)) + ":" +
                   io_fault_kind_name(f.fault));
    }
  }
  std::printf("%d passes, %d failed, %d indeterminate; kinds:", passes, failed,
              indeterminate);
  for (const std::string& k : kinds) std::printf(" %s", k.c_str());
  std::printf("\n");
  EXPECT_GT(failed, passes / 4);
  EXPECT_LT(failed, passes);
  for (const char* k : {"read:io_error", "read:crash", "write:io_error",
                        "write:no_space", "write:short_write",
                        "write:torn_write", "write:crash", "flush:io_error"}) {
    EXPECT_EQ(kinds.count(k), 1u) << k;
  }
}

// ----- Crash between swap-out and the next step ----------------------------

// The optimizer state swapped out by a committed step survives a power loss
// before the next step, and the next step then gives exactly what it gives
// without the crash; a crash in the middle of that next step loses nothing
// either: rerunning it from the reopened store gives the same bits.
TEST(SwapStoreTest, ACrashBetweenSwapOutAndTheNextStepLosesNothing) {
  for (uint64_t seed = 0; seed < 8; ++seed) {
    Rig rig(seed);        // generation 2 committed: the swap-out of step 1
    rig.device->crash();  // power loss; unsynced writes may be dropped
    rig.store.reset();
    rig.device->restart();
    SwapStore reopened(rig.device.get(), small_options());
    EXPECT_EQ(reopened.generation(), 2u);
    EXPECT_TRUE(same_bits(read_state(reopened), rig.s1));
    reopened.update(step_fn);
    EXPECT_TRUE(same_bits(read_state(reopened), rig.s2));
  }
  // The crash lands inside the next step, at every operation.
  const uint64_t ops = kReadsPerPass + kWritesPerPass + kFlushesPerPass;
  for (uint64_t at = 0; at < ops; ++at) {
    Rig rig(100 + at);
    FaultyBlockDevice& dev = *rig.device;
    // Walk the pass's operation order: reads and writes interleave, so
    // crash at the at-th operation of the kind it falls on by replaying
    // the pass once on a copy.
    std::vector<OpKind> order;
    {
      MemoryBlockDevice copy("copy");
      copy.reserve(rig.medium.size());
      copy.medium() = rig.medium.medium();
      FaultyBlockDevice counting(&copy);
      std::vector<RecordingDevice::Event> log;
      RecordingDevice rec(&counting, &log);
      SwapStore s(&rec, small_options());
      uint64_t before[4];
      for (int k = 0; k < 4; ++k) before[k] = counting.count(OpKind(k));
      log.clear();
      s.update(step_fn);
      for (const auto& e : log) {
        if (e.what == 'r') order.push_back(OpKind::kRead);
        if (e.what == 'w') order.push_back(OpKind::kWrite);
      }
      ASSERT_EQ(counting.count(OpKind::kRead) - before[0], kReadsPerPass);
      ASSERT_EQ(counting.count(OpKind::kWrite) - before[1], kWritesPerPass);
    }
    uint64_t idx[4] = {0, 0, 0, 0};
    OpKind kind = OpKind::kFlush;
    if (at < order.size()) {
      kind = order[at];
      for (uint64_t i = 0; i < at; ++i) ++idx[static_cast<int>(order[i])];
    } else {
      idx[static_cast<int>(OpKind::kFlush)] = at - order.size();
    }
    const uint64_t n = idx[static_cast<int>(kind)];
    dev.schedule(kind, dev.count(kind) + n, IoFaultKind::kCrash);
    EXPECT_THROW(rig.store->update(step_fn), IoError);
    ASSERT_TRUE(dev.crashed()) << at;
    rig.store.reset();
    dev.restart();
    SwapStore reopened(&dev, small_options());
    if (reopened.generation() == 2) {
      EXPECT_TRUE(same_bits(read_state(reopened), rig.s1)) << at;
      reopened.update(step_fn);  // the step, rerun
    }
    EXPECT_EQ(reopened.generation(), 3u) << at;
    EXPECT_TRUE(same_bits(read_state(reopened), rig.s2)) << at;
  }
}

// ----- Parameters in memory (Note [Parameters in memory]) ------------------

// exp_avg and exp_avg_sq on the device, parameters in memory, AdamW by
// fused_adam_step, the staged pattern: a failed step leaves the parameters
// and the moments at the old step; a successful one equals the kernel run
// on plain memory, bit for bit.
TEST(SwapStoreTest, StagedParametersStayConsistentWithTheStore) {
  const uint64_t n = 5000;
  SwapStoreOptions o = small_options();
  o.num_arrays = 2;
  const State init = random_state(3, n, 21);  // params, grads, unused
  std::vector<float> zeros(n, 0.0f);
  // 4 slots of 12288 bytes, 3 operations each, and the record.
  const uint64_t writes_per_pass = 4 * 3 + 1;
  for (uint64_t i = 0; i < writes_per_pass; ++i) {
    MemoryBlockDevice medium("m");
    FaultyBlockDevice dev(&medium);
    SwapStore store(&dev, o);
    std::vector<float> params = init[0], staging(n);
    const std::vector<float>& grads = init[1];
    const float* moments[2] = {zeros.data(), zeros.data()};
    store.write_arrays(moments);

    // Reference: the kernel on plain memory.
    std::vector<float> ref_p = params, ref_m = zeros, ref_v = zeros;
    AdamStepParams hyper;
    hyper.lr = 0.01;
    hyper.weight_decay = 0.1;
    auto step = [&](int t) {
      hyper.step = t;
      store.update([&](const SwapSubgroup& s) {
        float* p = staging.data() + s.first;
        std::memcpy(p, params.data() + s.first, s.count * sizeof(float));
        fused_adam_step(p, grads.data() + s.first, s.arrays[0], s.arrays[1],
                        s.count, hyper);
      });
      std::swap(params, staging);  // only after the commit
    };
    step(1);
    ASSERT_EQ(store.slot_bytes(), 12288u);
    hyper.step = 1;
    fused_adam_step(ref_p.data(), grads.data(), ref_m.data(), ref_v.data(), n,
                    hyper);
    const std::vector<float> p1 = params;
    ASSERT_EQ(std::memcmp(params.data(), ref_p.data(), n * 4), 0);

    dev.schedule(OpKind::kWrite, dev.count(OpKind::kWrite) + i,
                 IoFaultKind::kIoError);
    EXPECT_THROW(step(2), IoError);
    EXPECT_EQ(std::memcmp(params.data(), p1.data(), n * 4), 0) << i;
    State moments_now = read_state(store);
    EXPECT_EQ(std::memcmp(moments_now[0].data(), ref_m.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(moments_now[1].data(), ref_v.data(), n * 4), 0);

    step(2);  // the retry
    hyper.step = 2;
    fused_adam_step(ref_p.data(), grads.data(), ref_m.data(), ref_v.data(), n,
                    hyper);
    EXPECT_EQ(std::memcmp(params.data(), ref_p.data(), n * 4), 0) << i;
    moments_now = read_state(store);
    EXPECT_EQ(std::memcmp(moments_now[0].data(), ref_m.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(moments_now[1].data(), ref_v.data(), n * 4), 0);
  }
}

// ----- On a real file ------------------------------------------------------

// Parameters and both moments on a file (io_uring, O_DIRECT where
// supported), three AdamW steps: bitwise equal to the kernel on memory, and
// after reopening the file. Then faults from the decorator over the real
// device, and a byte changed in the file behind the store's back.
TEST(SwapStoreTest, AdamOnARealFile) {
  const std::string dir = make_temp_dir();
  const uint64_t n = 100000;
  SwapStoreOptions o;
  o.num_arrays = 3;
  o.numel = n;
  o.subgroup_numel = 16384;
  o.buffer_count = 3;
  o.io_chunk_bytes = 32 * 1024;
  const State init = random_state(2, n, 31);  // params, grads
  std::vector<float> ref_p = init[0], ref_m(n, 0.0f), ref_v(n, 0.0f);
  AdamStepParams hyper;
  hyper.weight_decay = 0.01;
  {
    auto dev = PosixBlockDevice::open_in_directory(dir, "rank0.swap");
    SwapStore store(dev.get(), o);
    write_state(store, {init[0], ref_m, ref_v});
    for (int t = 1; t <= 3; ++t) {
      hyper.step = t;
      store.update([&](const SwapSubgroup& s) {
        fused_adam_step(s.arrays[0], init[1].data() + s.first, s.arrays[1],
                        s.arrays[2], s.count, hyper);
      });
      fused_adam_step(ref_p.data(), init[1].data(), ref_m.data(), ref_v.data(),
                      n, hyper);
    }
    EXPECT_TRUE(same_bits(read_state(store), State{ref_p, ref_m, ref_v}));
  }
  auto dev = PosixBlockDevice::open_in_directory(dir, "rank0.swap");
  {
    FaultyBlockDevice faulty(dev.get());
    SwapStore store(&faulty, o);
    EXPECT_EQ(store.generation(), 4u);
    EXPECT_TRUE(same_bits(read_state(store), State{ref_p, ref_m, ref_v}));
    faulty.schedule(OpKind::kWrite, faulty.count(OpKind::kWrite) + 5,
                    IoFaultKind::kShortWrite);
    EXPECT_THROW(store.update(step_fn), IoError);
    faulty.schedule(OpKind::kFlush, faulty.count(OpKind::kFlush),
                    IoFaultKind::kIoError);
    EXPECT_THROW(store.update(step_fn), IoError);
    EXPECT_TRUE(same_bits(read_state(store), State{ref_p, ref_m, ref_v}));
  }
  // Change one byte of the committed copy (copy 0 at generation 4) with an
  // ordinary write to the file.
  {
    const int fd = ::open(dev->name().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0x5A;
    ASSERT_EQ(::pwrite(fd, &byte, 1, 8192 + 100), 1);
    ::close(fd);
  }
  SwapStore store(dev.get(), o);
  try {
    store.read_all([](const SwapSubgroupView&) {});
    FAIL() << "read modified data";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "corrupt sub-group 0")) << e.what();
    EXPECT_TRUE(contains(e.what(), dev->name())) << e.what();
  }
}

// read_range returns exactly the requested elements of one array of the
// committed state, for ranges inside one sub-group, across several and at
// the ragged end; it reads only the overlapping sub-groups, checks them,
// and rejects ranges outside the store.
TEST(SwapStoreTest, ReadRangeReadsTheOverlappingSubgroupsOfTheCommittedState) {
  MemoryBlockDevice mem("mem://range");
  FaultyBlockDevice dev(&mem, {});  // counts the reads
  SwapStoreOptions o;
  o.num_arrays = 2;
  o.numel = 1000;
  o.subgroup_numel = 96;  // 11 sub-groups, the last of 40
  o.buffer_count = 3;
  SwapStore store(&dev, o);
  std::vector<float> out(1001);  // one past the longest range, to check
  EXPECT_THROW(store.read_range(0, 0, 1, out.data()), UsageError);
  const State s = random_state(2, 1000, 9);
  store.write_arrays(const_ptrs(s).data());
  store.update(step_fn);  // generation 2: the other copy
  const State want = stepped(s);
  const uint64_t ranges[][2] = {{0, 1000}, {0, 96}, {5, 7},     {90, 20},
                                {96, 96},  {500, 0}, {950, 50}, {999, 1}};
  for (size_t k = 0; k < 2; ++k)
    for (const auto& r : ranges) {
      std::fill(out.begin(), out.end(), -7.0f);
      const uint64_t reads_before = dev.count(OpKind::kRead);
      store.read_range(k, r[0], r[1], out.data());
      EXPECT_EQ(std::memcmp(out.data(), want[k].data() + r[0],
                            r[1] * sizeof(float)),
                0)
          << "array " << k << " [" << r[0] << ", +" << r[1] << ")";
      EXPECT_EQ(out[r[1]], -7.0f);  // nothing past the range
      const uint64_t subgroups =
          r[1] == 0 ? 0 : (r[0] + r[1] - 1) / 96 - r[0] / 96 + 1;
      EXPECT_EQ(dev.count(OpKind::kRead) - reads_before, subgroups);
    }
  EXPECT_THROW(store.read_range(2, 0, 1, out.data()), UsageError);
  EXPECT_THROW(store.read_range(0, 990, 11, out.data()), UsageError);
  EXPECT_THROW(store.read_range(0, 1001, 0, out.data()), UsageError);
  // A corrupt byte in a sub-group the range covers is an IoError naming
  // the device; ranges elsewhere still read.
  mem.medium()[8192 + 3 * store.slot_bytes() + 8] ^= 0x40;  // copy 0, sg 3
  try {
    store.read_range(1, 300, 10, out.data());
    FAIL() << "read corrupt data";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "mem://range")) << e.what();
    EXPECT_TRUE(contains(e.what(), "corrupt sub-group 3")) << e.what();
  }
  store.read_range(1, 0, 288, out.data());
  EXPECT_EQ(std::memcmp(out.data(), want[1].data(), 288 * sizeof(float)), 0);
}

}  // namespace
}  // namespace zerostep

// ----- Two-phase passes -------------------------------------------------

namespace zerostep {
namespace {

// prepare + discard changes nothing; prepare + commit is update(); other
// passes wait for the decision; a crash or a record fault before the
// commit leaves the old state.
TEST(SwapStoreTwoPhaseTest, PrepareThenCommitOrDiscard) {
  Rig rig(7);
  SwapStore& store = *rig.store;
  store.prepare_update(step_fn);
  EXPECT_TRUE(store.has_prepared());
  EXPECT_EQ(store.generation(), 2u);
  EXPECT_THROW(store.update(step_fn), UsageError);
  EXPECT_THROW(read_state(store), UsageError);
  EXPECT_THROW(store.prepare_update(step_fn), UsageError);
  store.discard_prepared();
  EXPECT_EQ(store.generation(), 2u);
  EXPECT_TRUE(same_bits(read_state(store), rig.s1));
  store.prepare_update(step_fn);
  store.commit_prepared();
  EXPECT_EQ(store.generation(), 3u);
  EXPECT_TRUE(same_bits(read_state(store), rig.s2));
  EXPECT_THROW(store.commit_prepared(), UsageError);
}

TEST(SwapStoreTwoPhaseTest, CrashBeforeTheCommitComesBackOld) {
  Rig rig(8);
  rig.store->prepare_update(step_fn);
  rig.device->crash();
  rig.store.reset();
  rig.device->restart();
  SwapStore reopened(rig.device.get(), small_options());
  EXPECT_EQ(reopened.generation(), 2u);
  EXPECT_TRUE(same_bits(read_state(reopened), rig.s1));
}

TEST(SwapStoreTwoPhaseTest, AFailedCommitKeepsTheOldStateAndTheStoreUsable) {
  for (IoFaultKind fault : {IoFaultKind::kIoError, IoFaultKind::kTornWrite}) {
    Rig rig(9);
    FaultyBlockDevice& dev = *rig.device;
    rig.store->prepare_update(step_fn);
    // The commit's first operation is the record write.
    dev.schedule(OpKind::kWrite, dev.count(OpKind::kWrite), fault);
    try {
      rig.store->commit_prepared();
      FAIL() << "expected IoError";
    } catch (const IoError& e) {
      EXPECT_TRUE(contains(e.what(), "/nvme/rank0.swap")) << e.what();
      EXPECT_TRUE(contains(e.what(), "keeps generation 2")) << e.what();
    }
    EXPECT_FALSE(rig.store->has_prepared());
    if (dev.crashed()) {
      // A record torn at the crash may still be whole on the medium: the
      // reopened store is at the old state or, complete, the new one
      // (Note [Swap pass atomicity], the indeterminate commit).
      rig.store.reset();
      dev.restart();
      rig.store = std::make_unique<SwapStore>(&dev, small_options());
      if (rig.store->generation() == 3u) {
        EXPECT_TRUE(same_bits(read_state(*rig.store), rig.s2));
        continue;
      }
    }
    EXPECT_EQ(rig.store->generation(), 2u);
    EXPECT_TRUE(same_bits(read_state(*rig.store), rig.s1));
    rig.store->update(step_fn);
    EXPECT_TRUE(same_bits(read_state(*rig.store), rig.s2));
  }
}

}  // namespace
}  // namespace zerostep
