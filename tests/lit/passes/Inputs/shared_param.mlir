// One weight used by layer 0 and layer 1: with two stages it would live on both.
module {
  func.func @train_step(%w: tensor<8x8xf32> {loom.param = "shared.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
                        %x: tensor<2x4x8xf32> {loom.input = "tokens"}) -> tensor<2x4x8xf32> {
    %0 = loom.linear %x, %w {loom.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %1 = loom.linear %0, %w {loom.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %1 : tensor<2x4x8xf32>
  }
}
