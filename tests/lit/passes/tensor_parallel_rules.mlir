// loom-tensor-parallel's per-op rules on IR written by hand (not by the builder). The rule
// for each op is found from the dataflow: what a linear's output reaches decides whether it
// is column-parallel, row-parallel, vocab-parallel or an error.
// RUN: loomc opt %s --split-input-file --loom-tensor-parallel=tp=2 --verify-diagnostics | FileCheck %s

// A gated MLP: two column-parallel up projections (one behind a GeLU) summed, then one
// row-parallel down projection. Both share one f; the up bias is split with its columns, the
// down weight by rows, and one all-reduce (g) closes the region.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %arg0: tensor<4x8xf32> {{{.*}}loom.param = "gate.weight", loom.shard_dim = 1 : i64, loom.shard_parts = 2 : i64}
// CHECK-SAME: %arg1: tensor<4x8xf32> {{{.*}}loom.param = "up.weight", loom.shard_dim = 1 : i64
// CHECK-SAME: %arg2: tensor<8xf32> {{{.*}}loom.param = "up.bias", loom.shard_dim = 0 : i64
// CHECK-SAME: %arg3: tensor<8x4xf32> {{{.*}}loom.param = "down.weight", loom.shard_dim = 0 : i64
// CHECK-SAME: %arg4: tensor<4xf32> {{{.*}}loom.param = "down.bias"}
// CHECK: %[[F:.*]] = loom.identity %{{.*}} {group = "tp", group_size = 2 : i64, loom.layer = 0 : i64}
// CHECK-NEXT: %[[G:.*]] = loom.linear %[[F]], %arg0 {{.*}} -> tensor<?x3x8xf32>
// CHECK-NEXT: %[[A:.*]] = loom.gelu %[[G]] {{.*}} : tensor<?x3x8xf32>
// CHECK-NEXT: %[[U:.*]] = loom.linear %[[F]], %arg1, %arg2 {{.*}} -> tensor<?x3x8xf32>
// CHECK-NEXT: %[[M:.*]] = loom.add %[[A]], %[[U]] {{.*}} : tensor<?x3x8xf32>
// CHECK-NEXT: %[[D:.*]] = loom.linear %[[M]], %arg3 {{.*}} : (tensor<?x3x8xf32>, tensor<8x4xf32>) -> tensor<?x3x4xf32>
// CHECK-NEXT: %[[R:.*]] = loom.all_reduce %[[D]] {group = "tp", group_size = 2 : i64, loom.layer = 0 : i64}
// CHECK-NEXT: loom.add_bias %[[R]], %arg4
// The untied output layer, stored [hidden, vocab]: split by output features, fused with the
// vocab-parallel cross-entropy.
// CHECK: loom.identity
// CHECK-NEXT: %[[L:.*]] = loom.linear {{.*}} : (tensor<?x3x4xf32>, tensor<4x8xf32>) -> tensor<?x3x8xf32>
// CHECK-NEXT: loom.cross_entropy %[[L]], {{.*}}vocab_parallel_group = "tp"
module {
  func.func @train_step(%wg: tensor<4x16xf32> {loom.param = "gate.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %wu: tensor<4x16xf32> {loom.param = "up.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %bu: tensor<16xf32> {loom.param = "up.bias", loom.init = "zeros"},
                        %wd: tensor<16x4xf32> {loom.param = "down.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %bd: tensor<4xf32> {loom.param = "down.bias", loom.init = "zeros"},
                        %wte: tensor<16x4xf32> {loom.param = "wte", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %head: tensor<4x16xf32> {loom.param = "head", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %tok: tensor<?x3xi32> {loom.input = "tokens"}, %lab: tensor<?x3xi32> {loom.input = "labels"}) -> tensor<f32> {
    %x = loom.embedding %tok, %wte : (tensor<?x3xi32>, tensor<16x4xf32>) -> tensor<?x3x4xf32>
    %g = loom.linear %x, %wg {loom.layer = 0 : i64} : (tensor<?x3x4xf32>, tensor<4x16xf32>) -> tensor<?x3x16xf32>
    %a = loom.gelu %g {loom.layer = 0 : i64} : tensor<?x3x16xf32>
    %u = loom.linear %x, %wu, %bu {loom.layer = 0 : i64} : (tensor<?x3x4xf32>, tensor<4x16xf32>, tensor<16xf32>) -> tensor<?x3x16xf32>
    %m = loom.add %a, %u {loom.layer = 0 : i64} : tensor<?x3x16xf32>
    %d = loom.linear %m, %wd, %bd {loom.layer = 0 : i64} : (tensor<?x3x16xf32>, tensor<16x4xf32>, tensor<4xf32>) -> tensor<?x3x4xf32>
    %y = loom.add %x, %d {loom.layer = 0 : i64} : tensor<?x3x4xf32>
    %l = loom.linear %y, %head : (tensor<?x3x4xf32>, tensor<4x16xf32>) -> tensor<?x3x16xf32>
    %loss = loom.cross_entropy %l, %lab {valid_vocab = 16 : i64} : (tensor<?x3x16xf32>, tensor<?x3xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// A linear whose output needs the whole feature dimension (a layer norm follows) fits no
// split rule: an error naming it, not a silently replicated GEMM.
module {
  func.func @train_step(%w: tensor<4x4xf32> {loom.param = "dense.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %g: tensor<4xf32> {loom.param = "ln.weight", loom.init = "ones"},
                        %b: tensor<4xf32> {loom.param = "ln.bias", loom.init = "zeros"},
                        %x: tensor<2x3x4xf32> {loom.input = "tokens"}) -> tensor<2x3x4xf32> {
    // expected-error @+1 {{'loom.linear' op loom-tensor-parallel: cannot split this linear: its output reaches 'loom.layer_norm'}}
    %h = loom.linear %x, %w : (tensor<2x3x4xf32>, tensor<4x4xf32>) -> tensor<2x3x4xf32>
    %n = loom.layer_norm %h, %g, %b : (tensor<2x3x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32>
    return %n : tensor<2x3x4xf32>
  }
}

// -----

// The same linear marked loom.replicated stays whole on every rank.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %arg0: tensor<4x4xf32> {loom.init = "normal", loom.init_std = 2.000000e-02 : f32, loom.param = "dense.weight"}
// CHECK-NOT: loom.identity
// CHECK: loom.linear %arg3, %arg0 {loom.replicated} : (tensor<2x3x4xf32>, tensor<4x4xf32>) -> tensor<2x3x4xf32>
module {
  func.func @train_step(%w: tensor<4x4xf32> {loom.param = "dense.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %g: tensor<4xf32> {loom.param = "ln.weight", loom.init = "ones"},
                        %b: tensor<4xf32> {loom.param = "ln.bias", loom.init = "zeros"},
                        %x: tensor<2x3x4xf32> {loom.input = "tokens"}) -> tensor<2x3x4xf32> {
    %h = loom.linear %x, %w {loom.replicated} : (tensor<2x3x4xf32>, tensor<4x4xf32>) -> tensor<2x3x4xf32>
    %n = loom.layer_norm %h, %g, %b : (tensor<2x3x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32>
    return %n : tensor<2x3x4xf32>
  }
}

// -----

// A residual add inside what would be the parallel region: the other operand is not split.
module {
  func.func @train_step(%w1: tensor<4x4xf32> {loom.param = "a.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %w2: tensor<4x4xf32> {loom.param = "b.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %x: tensor<2x3x4xf32> {loom.input = "tokens"}) -> tensor<2x3x4xf32> {
    // expected-error @+1 {{its output reaches 'loom.add'}}
    %h = loom.linear %x, %w1 : (tensor<2x3x4xf32>, tensor<4x4xf32>) -> tensor<2x3x4xf32>
    %r = loom.add %x, %h : tensor<2x3x4xf32>
    %o = loom.linear %r, %w2 {loom.replicated} : (tensor<2x3x4xf32>, tensor<4x4xf32>) -> tensor<2x3x4xf32>
    return %o : tensor<2x3x4xf32>
  }
}

// -----

// An attention core whose qkv is not column-parallel cannot be split by heads.
module {
  func.func @train_step(%g: tensor<12xf32> {loom.param = "ln.weight", loom.init = "ones"},
                        %b: tensor<12xf32> {loom.param = "ln.bias", loom.init = "zeros"},
                        %x: tensor<2x3x12xf32> {loom.input = "tokens"}) -> tensor<2x3x4xf32> {
    %n = loom.layer_norm %x, %g, %b : (tensor<2x3x12xf32>, tensor<12xf32>, tensor<12xf32>) -> tensor<2x3x12xf32>
    // expected-error @+1 {{'loom.attention' op loom-tensor-parallel: cannot split this attention core: its queries do not come from a column-parallel linear (t = 2)}}
    %a = loom.attention %n {causal, num_heads = 2 : i64} : (tensor<2x3x12xf32>) -> tensor<2x3x4xf32>
    return %a : tensor<2x3x4xf32>
  }
}

// -----

// Ops that are not part of a model's forward pass have no rule.
module {
  func.func @train_step(%x: tensor<2x3x4xf32> {loom.input = "tokens"}) -> tensor<2x3x4xf32> {
    // expected-error @+1 {{'loom.all_reduce' op loom-tensor-parallel: no tensor-parallel rule for this op}}
    %r = loom.all_reduce %x {group = "tp", group_size = 2 : i64} : tensor<2x3x4xf32>
    return %r : tensor<2x3x4xf32>
  }
}

// -----

// A split dimension t does not divide.
module {
  func.func @train_step(%w1: tensor<4x6xf32> {loom.param = "fc1.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %w2: tensor<6x4xf32> {loom.param = "fc2.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %x: tensor<2x3x4xf32> {loom.input = "tokens"}) -> tensor<2x3x4xf32> {
    %h = loom.linear %x, %w1 : (tensor<2x3x4xf32>, tensor<4x6xf32>) -> tensor<2x3x6xf32>
    %a = loom.gelu %h : tensor<2x3x6xf32>
    %o = loom.linear %a, %w2 : (tensor<2x3x6xf32>, tensor<6x4xf32>) -> tensor<2x3x4xf32>
    return %o : tensor<2x3x4xf32>
  }
}

// -----

// Under sequence parallelism a replicated attention core would see a slice of the sequence.
// RUN: not loomc opt %s --split-input-file --loom-tensor-parallel="tp=2 sequence-parallel=true" 2>&1 | FileCheck --check-prefix=SP %s
// SP: 'loom.attention' op loom-tensor-parallel: a loom.replicated attention core cannot run under sequence parallelism
module {
  func.func @train_step(%w: tensor<4x12xf32> {loom.param = "qkv.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %x: tensor<2x4x4xf32> {loom.input = "tokens"}) -> tensor<2x4x4xf32> {
    %q = loom.linear %x, %w {loom.replicated} : (tensor<2x4x4xf32>, tensor<4x12xf32>) -> tensor<2x4x12xf32>
    %a = loom.attention %q {causal, num_heads = 1 : i64, loom.replicated} : (tensor<2x4x12xf32>) -> tensor<2x4x4xf32>
    return %a : tensor<2x4x4xf32>
  }
}
