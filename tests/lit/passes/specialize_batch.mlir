// loom-specialize-batch: the dynamic batch (dim 0 of the inputs and activations) becomes the
// cluster's micro-batch everywhere, the function type included.
// RUN: loomc opt %s --split-input-file --loom-specialize-batch=batch=4 --verify-diagnostics | FileCheck %s

// CHECK-LABEL: func.func @train_step
// CHECK-SAME: (%arg0: tensor<20x4xf32> {{.*}}, %arg1: tensor<4x3xi32> {loom.input = "tokens"}) -> tensor<4x3x4xf32>
// CHECK: loom.embedding %arg1, %arg0 : (tensor<4x3xi32>, tensor<20x4xf32>) -> tensor<4x3x4xf32>
module {
  func.func @train_step(%wte: tensor<20x4xf32> {loom.param = "wte", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %tok: tensor<?x3xi32> {loom.input = "tokens"}) -> tensor<?x3x4xf32> {
    %x = loom.embedding %tok, %wte : (tensor<?x3xi32>, tensor<20x4xf32>) -> tensor<?x3x4xf32>
    return %x : tensor<?x3x4xf32>
  }
}

// -----

// A static batch that disagrees with the micro-batch.
module {
  // expected-error @+1 {{the IR's batch dimension is 2 (tokens: 'tensor<2x3xi32>') but the cluster's micro_batch_size is 4}}
  func.func @train_step(%wte: tensor<20x4xf32> {loom.param = "wte", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %tok: tensor<2x3xi32> {loom.input = "tokens"}) -> tensor<2x3x4xf32> {
    %x = loom.embedding %tok, %wte : (tensor<2x3xi32>, tensor<20x4xf32>) -> tensor<2x3x4xf32>
    return %x : tensor<2x3x4xf32>
  }
}

// -----

// A parameter's dimensions are never the batch.
module {
  // expected-error @+1 {{parameter 'wte' has a dynamic dimension ('tensor<?x4xf32>'): parameters must have static shapes}}
  func.func @train_step(%wte: tensor<?x4xf32> {loom.param = "wte", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %tok: tensor<?x3xi32> {loom.input = "tokens"}) -> tensor<?x3x4xf32> {
    %x = loom.embedding %tok, %wte : (tensor<?x3xi32>, tensor<?x4xf32>) -> tensor<?x3x4xf32>
    return %x : tensor<?x3x4xf32>
  }
}
