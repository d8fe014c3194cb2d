// loom-pad-vocab: the vocabulary dimensions are found from the dataflow (the embedding's
// table rows, the output layer's features) and padded to a multiple; cross_entropy keeps
// valid_vocab, so the padded logits never enter the softmax.
// RUN: loomc opt %s --split-input-file --loom-pad-vocab=multiple=8 --verify-diagnostics | FileCheck %s

// An untied output layer stored [hidden, vocab] with a bias: padded along dim 1 and dim 0.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %arg0: tensor<24x4xf32> {loom.init = "normal", loom.init_std = 2.000000e-02 : f32, loom.padded_dim = 0 : i64, loom.param = "wte", loom.unpadded_size = 20 : i64}
// CHECK-SAME: %arg1: tensor<4x24xf32> {loom.init = "normal", loom.init_std = 2.000000e-02 : f32, loom.padded_dim = 1 : i64, loom.param = "head", loom.unpadded_size = 20 : i64}
// CHECK-SAME: %arg2: tensor<24xf32> {loom.init = "zeros", loom.padded_dim = 0 : i64, loom.param = "head.bias", loom.unpadded_size = 20 : i64}
// CHECK: loom.linear {{.*}} -> tensor<?x3x24xf32>
// CHECK-NEXT: loom.cross_entropy {{.*}}valid_vocab = 20 : i64
module {
  func.func @train_step(%wte: tensor<20x4xf32> {loom.param = "wte", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %head: tensor<4x20xf32> {loom.param = "head", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %hb: tensor<20xf32> {loom.param = "head.bias", loom.init = "zeros"},
                        %tok: tensor<?x3xi32> {loom.input = "tokens"}, %lab: tensor<?x3xi32> {loom.input = "labels"}) -> tensor<f32> {
    %x = loom.embedding %tok, %wte : (tensor<?x3xi32>, tensor<20x4xf32>) -> tensor<?x3x4xf32>
    %l = loom.linear %x, %head, %hb : (tensor<?x3x4xf32>, tensor<4x20xf32>, tensor<20xf32>) -> tensor<?x3x20xf32>
    %loss = loom.cross_entropy %l, %lab {valid_vocab = 20 : i64} : (tensor<?x3x20xf32>, tensor<?x3xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Already a multiple: nothing changes, no padding facts.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %arg0: tensor<16x4xf32> {loom.init = "normal", loom.init_std = 2.000000e-02 : f32, loom.param = "wte"}
// CHECK: loom.linear %{{.*}}, %arg0 {transpose_weight} : (tensor<?x3x4xf32>, tensor<16x4xf32>) -> tensor<?x3x16xf32>
module {
  func.func @train_step(%wte: tensor<16x4xf32> {loom.param = "wte", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %tok: tensor<?x3xi32> {loom.input = "tokens"}, %lab: tensor<?x3xi32> {loom.input = "labels"}) -> tensor<f32> {
    %x = loom.embedding %tok, %wte : (tensor<?x3xi32>, tensor<16x4xf32>) -> tensor<?x3x4xf32>
    %l = loom.linear %x, %wte {transpose_weight} : (tensor<?x3x4xf32>, tensor<16x4xf32>) -> tensor<?x3x16xf32>
    %loss = loom.cross_entropy %l, %lab {valid_vocab = 16 : i64} : (tensor<?x3x16xf32>, tensor<?x3xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Logits that do not come straight from a linear have no output layer to pad.
module {
  func.func @train_step(%wte: tensor<20x4xf32> {loom.param = "wte", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %g: tensor<20xf32> {loom.param = "g", loom.init = "ones"}, %b: tensor<20xf32> {loom.param = "b", loom.init = "zeros"},
                        %x: tensor<2x3x20xf32> {loom.input = "tokens"}, %lab: tensor<2x3xi32> {loom.input = "labels"}) -> tensor<f32> {
    %n = loom.layer_norm %x, %g, %b : (tensor<2x3x20xf32>, tensor<20xf32>, tensor<20xf32>) -> tensor<2x3x20xf32>
    // expected-error @+1 {{'loom.cross_entropy' op loom-pad-vocab: the logits must come straight from a loom.linear used only here (the output layer) to pad the vocabulary}}
    %loss = loom.cross_entropy %n, %lab {valid_vocab = 20 : i64} : (tensor<2x3x20xf32>, tensor<2x3xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
