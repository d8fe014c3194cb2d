// Every op of the dialect prints and parses back to the same text.
// RUN: loomc verify %s -o %t.1
// RUN: loomc verify %t.1 -o %t.2
// RUN: diff %t.1 %t.2
// RUN: FileCheck %s < %t.2

// CHECK-LABEL: func.func @all_ops
// CHECK-SAME: loom.param = "wte"
// CHECK-SAME: loom.init = "normal"
// CHECK-SAME: loom.input = "tokens"
func.func @all_ops(%wte: tensor<128x16xf32> {loom.param = "wte", loom.init = "normal", loom.init_std = 0.02 : f32},
                   %wpe: tensor<8x16xf32> {loom.param = "wpe", loom.init = "normal", loom.init_std = 0.02 : f32},
                   %g: tensor<16xf32> {loom.param = "ln.weight", loom.init = "ones"},
                   %b: tensor<16xf32> {loom.param = "ln.bias", loom.init = "zeros"},
                   %wqkv: tensor<16x48xf32> {loom.param = "qkv.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                   %tokens: tensor<2x8xi32> {loom.input = "tokens"},
                   %labels: tensor<2x8xi32> {loom.input = "labels"},
                   %mask: tensor<2x8xf32> {loom.input = "loss_mask"}) -> tensor<f32> {
  // CHECK: loom.embedding %{{.*}} : (tensor<2x8xi32>, tensor<128x16xf32>, tensor<8x16xf32>) -> tensor<2x8x16xf32>
  %x = loom.embedding %tokens, %wte, %wpe : (tensor<2x8xi32>, tensor<128x16xf32>, tensor<8x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: loom.dropout %{{.*}} {rate = 1.000000e-01 : f32, stream = 3 : i64} : tensor<2x8x16xf32>
  %d = loom.dropout %x {rate = 0.1 : f32, stream = 3} : tensor<2x8x16xf32>
  // CHECK: loom.layer_norm %{{.*}} {loom.layer = 0 : i64}
  %n = loom.layer_norm %d, %g, %b {epsilon = 1.0e-5 : f32, loom.layer = 0} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: loom.linear %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<16x48xf32>) -> tensor<2x8x48xf32>
  %qkv = loom.linear %n, %wqkv : (tensor<2x8x16xf32>, tensor<16x48xf32>) -> tensor<2x8x48xf32>
  // CHECK: loom.attention %{{.*}}, %{{.*}} {causal, num_heads = 2 : i64}
  %a = loom.attention %qkv, %mask {num_heads = 2, causal} : (tensor<2x8x48xf32>, tensor<2x8xf32>) -> tensor<2x8x16xf32>
  // With its softmax statistics, and their use by the gradient:
  // CHECK: %[[R:.*]], %[[L:.*]] = loom.attention %{{.*}} {causal, num_heads = 2 : i64} : (tensor<2x8x48xf32>) -> (tensor<2x8x16xf32>, tensor<2x2x8xf32>)
  %st:2 = loom.attention %qkv {num_heads = 2, causal} : (tensor<2x8x48xf32>) -> (tensor<2x8x16xf32>, tensor<2x2x8xf32>)
  // CHECK: loom.attention_grad %{{.*}}, %[[R]], %[[L]], %{{.*}} {causal, num_heads = 2 : i64} : (tensor<2x8x48xf32>, tensor<2x8x16xf32>, tensor<2x2x8xf32>, tensor<2x8xf32>) -> tensor<2x8x48xf32>
  %agrad = loom.attention_grad %qkv, %st#0, %st#1, %mask {num_heads = 2, causal} : (tensor<2x8x48xf32>, tensor<2x8x16xf32>, tensor<2x2x8xf32>, tensor<2x8xf32>) -> tensor<2x8x48xf32>
  // CHECK: loom.gelu
  %ge = loom.gelu %a : tensor<2x8x16xf32>
  // CHECK: loom.add
  %s = loom.add %ge, %x : tensor<2x8x16xf32>
  // CHECK: loom.all_reduce %{{.*}} {group = "tp", group_size = 2 : i64} : tensor<2x8x16xf32>
  %r = loom.all_reduce %s {group = "tp", group_size = 2} : tensor<2x8x16xf32>
  // CHECK: loom.all_reduce %{{.*}} {group = "tp", group_size = 2 : i64, reduce = "max"}
  %m = loom.all_reduce %r {group = "tp", group_size = 2, reduce = "max"} : tensor<2x8x16xf32>
  // CHECK: loom.reduce_scatter %{{.*}} {dim = 1 : i64, group = "tp", group_size = 2 : i64} : (tensor<2x8x16xf32>) -> tensor<2x4x16xf32>
  %rs = loom.reduce_scatter %m {group = "tp", group_size = 2, dim = 1} : (tensor<2x8x16xf32>) -> tensor<2x4x16xf32>
  // CHECK: loom.all_gather %{{.*}} {dim = 1 : i64, group = "tp", group_size = 2 : i64} : (tensor<2x4x16xf32>) -> tensor<2x8x16xf32>
  %ag = loom.all_gather %rs {group = "tp", group_size = 2, dim = 1} : (tensor<2x4x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: loom.send %{{.*}} {group = "pp", group_size = 2 : i64, peer = 1 : i64} : tensor<2x8x16xf32>
  loom.send %ag {group = "pp", group_size = 2, peer = 1} : tensor<2x8x16xf32>
  // CHECK: loom.recv {group = "pp", group_size = 2 : i64, peer = 1 : i64, tag = 7 : i64} : tensor<2x8x16xf32>
  %rv = loom.recv {group = "pp", group_size = 2, peer = 1, tag = 7} : tensor<2x8x16xf32>
  // CHECK: loom.linear %{{.*}}, %{{.*}} {transpose_weight} : (tensor<2x8x16xf32>, tensor<128x16xf32>) -> tensor<2x8x128xf32>
  %logits = loom.linear %rv, %wte {transpose_weight} : (tensor<2x8x16xf32>, tensor<128x16xf32>) -> tensor<2x8x128xf32>
  // CHECK: loom.cross_entropy %{{.*}}, %{{.*}}, %{{.*}} {valid_vocab = 100 : i64}
  %loss = loom.cross_entropy %logits, %labels, %mask {valid_vocab = 100} : (tensor<2x8x128xf32>, tensor<2x8xi32>, tensor<2x8xf32>) -> tensor<f32>
  // CHECK: %{{.*}}, %[[LSE:.*]] = loom.cross_entropy %{{.*}} -> (tensor<f32>, tensor<2x8xf32>)
  %kept, %lse = loom.cross_entropy %logits, %labels {valid_vocab = 100} : (tensor<2x8x128xf32>, tensor<2x8xi32>) -> (tensor<f32>, tensor<2x8xf32>)
  // CHECK: loom.cross_entropy_grad %{{.*}}, %{{.*}}, %[[LSE]] mask %{{.*}} {loss_scale = 5.000000e-01 : f32, valid_vocab = 100 : i64}
  %dl = loom.cross_entropy_grad %logits, %labels, %lse mask %mask {valid_vocab = 100, loss_scale = 0.5 : f32} : (tensor<2x8x128xf32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8x128xf32>
  return %loss : tensor<f32>
}

// bf16 and f16 tensors are accepted as well.
// CHECK-LABEL: func.func @half_types
func.func @half_types(%x: tensor<4x8xbf16>, %w: tensor<8x8xbf16>, %y: tensor<4x8xf16>) -> (tensor<4x8xbf16>, tensor<4x8xf16>) {
  // CHECK: loom.linear {{.*}} -> tensor<4x8xbf16>
  %0 = loom.linear %x, %w : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16>
  // CHECK: loom.gelu {{.*}} : tensor<4x8xf16>
  %1 = loom.gelu %y : tensor<4x8xf16>
  return %0, %1 : tensor<4x8xbf16>, tensor<4x8xf16>
}
