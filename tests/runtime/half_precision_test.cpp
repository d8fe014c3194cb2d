// 16-bit buffers on the CPU executor: the conversions round as torch and the GPUs do (to
// nearest, ties to even; NaN and overflow as IEEE says), and a hand-built program with bf16
// activations and a bf16 argument runs with fp32 arithmetic between exactly two rounding
// points per instruction: its operands are widened (exactly) before the kernel and its
// outputs rounded after it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "protos/plan.pb.h"
#include "runtime/Executor.h"
#include "runtime/cpu/HalfStorage.h"

namespace loom {
namespace {

using cpu::bf16ToFloat;
using cpu::f16ToFloat;
using cpu::floatToBf16;
using cpu::floatToF16;

float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(HalfPrecision, Bf16RoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(bitsToFloat(0x3f808000u)), 0x3f80);  // a tie: to the even neighbour, down
  EXPECT_EQ(floatToBf16(bitsToFloat(0x3f818000u)), 0x3f82);  // a tie: to the even neighbour, up
  EXPECT_EQ(floatToBf16(bitsToFloat(0x3f808001u)), 0x3f81);  // past the tie: up
  EXPECT_EQ(floatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(floatToBf16(bitsToFloat(0x7f7fffffu)), 0x7f80);  // the largest float rounds to inf
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(bitsToFloat(0x7f800001u)))));  // a NaN never becomes inf
  for (uint32_t h : {0x0000u, 0x3f80u, 0x4049u, 0xc2f7u, 0x0001u, 0x7f7fu})  // widening is exact
    EXPECT_EQ(floatToBf16(bf16ToFloat(uint16_t(h))), h);
}

TEST(HalfPrecision, Fp16RoundsToNearestEvenAndOverflowsToInf) {
  EXPECT_EQ(floatToF16(1.0f), 0x3c00);
  EXPECT_EQ(floatToF16(0.1f), 0x2e66);
  EXPECT_EQ(floatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(floatToF16(65520.0f), 0x7c00);  // half-way past the largest finite: inf
  EXPECT_EQ(floatToF16(1.0f + 1.0f / 2048), 0x3c00);  // a tie: to even
  EXPECT_FLOAT_EQ(f16ToFloat(0x3555), 0.33325195f);
}

int addBuffer(plan::Program &p, std::vector<int64_t> shape, plan::DType dtype, int64_t offset) {
  plan::Buffer *b = p.add_buffers();
  b->set_id(p.buffers_size() - 1);
  int64_t n = 1;
  for (int64_t d : shape) b->add_shape(d), n *= d;
  b->set_dtype(dtype);
  b->set_bytes((dtype == plan::BF16 || dtype == plan::F16 ? 2 : 4) * n);
  b->set_kind(offset < 0 ? plan::Buffer::ARGUMENT : plan::Buffer::ACTIVATION);
  if (offset >= 0) b->set_offset(offset);
  b->set_first_use(offset < 0 ? -1 : 0);
  b->set_last_use(3);
  return b->id();
}

plan::Instruction *add(plan::Program &p, const char *op, std::vector<int> inputs, std::vector<int> outputs) {
  plan::Instruction *in = p.add_instructions();
  in->set_op(op), in->set_stream(plan::COMPUTE);
  for (int b : inputs) in->add_inputs(b);
  for (int b : outputs) in->add_outputs(b);
  return in;
}

// y = cast_f32(linear(cast_bf16(x), w)) with x fp32 [3, 4], w a bf16 argument [4, 5]; and a
// bf16 gradient added into an fp32 accumulator.
TEST(HalfPrecision, ABf16ProgramRoundsEachInstructionsOutputsOnce) {
  plan::Program p;
  p.set_name("forward_0");
  int x = addBuffer(p, {3, 4}, plan::F32, -1), w = addBuffer(p, {4, 5}, plan::BF16, -1);
  int acc = addBuffer(p, {5}, plan::F32, -1), g = addBuffer(p, {5}, plan::BF16, -1);
  int xb = addBuffer(p, {3, 4}, plan::BF16, 0), yb = addBuffer(p, {3, 5}, plan::BF16, 64);
  int y = addBuffer(p, {3, 5}, plan::F32, 128);
  for (int a : {x, w, acc, g}) p.add_arguments()->set_buffer(a);
  p.mutable_arguments(2)->set_inout(true);
  p.add_results()->set_buffer(y);
  p.set_workspace_bytes(192);
  add(p, "cast", {x}, {xb});
  add(p, "linear", {xb, w}, {yb});
  add(p, "cast", {yb}, {y});
  add(p, "accumulate", {g}, {acc});

  // x holds ties that bf16 rounds to even (1 + 2^-8 -> 1, 3 + 3 * 2^-8 -> 3 + 2^-6), w small
  // integers: every product and sum below is exact in fp32, so only the roundings show.
  std::vector<float> xs(12), accs(5, 0.5f);
  std::vector<uint16_t> ws(20), gs(5);
  for (int i = 0; i < 12; ++i) xs[size_t(i)] = float(i % 4 - 1) + (i % 3 == 0 ? 1.0f / 256 : 0.0f);
  xs[5] = 3.0f + 3.0f / 256;
  for (int i = 0; i < 20; ++i) ws[size_t(i)] = floatToBf16(float(i % 5 - 2));
  for (int i = 0; i < 5; ++i) gs[size_t(i)] = floatToBf16(0.1f * float(i + 1));
  std::vector<ArgumentView> args(4);
  args[0].f = xs.data(), args[0].count = 12;
  args[1].h = ws.data(), args[1].count = 20;
  args[2].f = accs.data(), args[2].count = 5;
  args[3].h = gs.data(), args[3].count = 5;
  std::vector<float> got;
  Status s = executeProgram(p, args, [&](int, const float *data, int64_t n) { got.assign(data, data + n); },
                            ExecutionContext{});
  ASSERT_TRUE(s.isOk()) << s.message();
  ASSERT_EQ(got.size(), 15u);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) {
      float sum = 0;  // bf16(x) @ w in fp32, then rounded once to bf16
      for (int k = 0; k < 4; ++k) sum += bf16ToFloat(floatToBf16(xs[size_t(i * 4 + k)])) * bf16ToFloat(ws[size_t(k * 5 + j)]);
      EXPECT_EQ(got[size_t(i * 5 + j)], bf16ToFloat(floatToBf16(sum))) << i << "," << j;
    }
  EXPECT_EQ(bf16ToFloat(floatToBf16(xs[5])), 3.0f + 1.0f / 64);  // the tie did round to even
  for (int i = 0; i < 5; ++i) EXPECT_EQ(accs[size_t(i)], 0.5f + bf16ToFloat(gs[size_t(i)])) << i;
}

// A 16-bit argument must come as 16-bit storage: an fp32 view of it is refused in one line.
TEST(HalfPrecision, A16BitArgumentGivenAsFp32IsRefused) {
  plan::Program p;
  p.set_name("forward_0");
  int w = addBuffer(p, {4}, plan::BF16, -1), y = addBuffer(p, {4}, plan::F32, 0);
  p.add_arguments()->set_buffer(w);
  p.mutable_arguments(0)->set_name("w");
  p.add_results()->set_buffer(y);
  p.set_workspace_bytes(16);
  add(p, "cast", {w}, {y});
  std::vector<float> ws(4, 1.0f);
  std::vector<ArgumentView> args(1);
  args[0].f = ws.data(), args[0].count = 4;
  Status s = executeProgram(p, args, [](int, const float *, int64_t) {}, ExecutionContext{});
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.message(), "forward_0: argument 'w' has the wrong element type (BF16)");
}

}  // namespace
}  // namespace loom
