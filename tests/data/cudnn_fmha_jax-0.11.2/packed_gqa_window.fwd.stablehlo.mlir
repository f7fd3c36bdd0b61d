module @jit_attn attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x1024x8x128xbf16>, %arg1: tensor<2x1024x2x128xbf16>, %arg2: tensor<2x1024x2x128xbf16>, %arg3: tensor<2x3xi32>, %arg4: tensor<2x3xi32>, %arg5: tensor<2x4xi32>, %arg6: tensor<2x4xi32>) -> (tensor<2x1024x8x128xbf16> {jax.result_info = "result"}) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<bf16>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<bf16>) -> tensor<0xbf16>
    %1 = stablehlo.reshape %arg3 : (tensor<2x3xi32>) -> tensor<6xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %2 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %3 = stablehlo.compare GE, %1, %2, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %4 = call @cumsum(%3) : (tensor<6xi1>) -> tensor<6xi32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %6 = call @clip(%4, %c_1) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %7 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %8 = stablehlo.compare LT, %6, %7, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_3 = stablehlo.constant dense<6> : tensor<i32>
    %9 = stablehlo.broadcast_in_dim %c_3, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %10 = stablehlo.add %6, %9 : tensor<6xi32>
    %11 = stablehlo.select %8, %10, %6 : tensor<6xi1>, tensor<6xi32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [0] : (tensor<6xi32>) -> tensor<6x1xi32>
    %c_4 = stablehlo.constant dense<1> : tensor<i32>
    %13 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %14 = "stablehlo.scatter"(%5, %12, %13) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%arg7: tensor<i32>, %arg8: tensor<i32>):
      %129 = stablehlo.add %arg7, %arg8 : tensor<i32>
      stablehlo.return %129 : tensor<i32>
    }) : (tensor<6xi32>, tensor<6x1xi32>, tensor<6xi32>) -> tensor<6xi32>
    %15 = call @cumsum_1(%14) : (tensor<6xi32>) -> tensor<6xi32>
    %c_5 = stablehlo.constant dense<1> : tensor<i32>
    %16 = call @floor_divide(%15, %c_5) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>
    %c_6 = stablehlo.constant dense<6> : tensor<i32>
    %17 = call @remainder(%16, %c_6) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>
    %18 = stablehlo.iota dim = 0 : tensor<6xi32>
    %19 = stablehlo.convert %3 : (tensor<6xi1>) -> tensor<6xi32>
    %c_7 = stablehlo.constant dense<0> : tensor<i32>
    %20 = stablehlo.reduce(%19 init: %c_7) applies stablehlo.add across dimensions = [0] : (tensor<6xi32>, tensor<i32>) -> tensor<i32>
    %21 = stablehlo.broadcast_in_dim %20, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %22 = stablehlo.compare GE, %18, %21, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_8 = stablehlo.constant dense<6> : tensor<i32>
    %23 = call @_where_3(%22, %c_8, %17) : (tensor<6xi1>, tensor<i32>, tensor<6xi32>) -> tensor<6xi32>
    %24 = call @_take(%1, %23) : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi32>
    %25 = stablehlo.reshape %24 : (tensor<6xi32>) -> tensor<2x3xi32>
    %26 = stablehlo.reshape %arg4 : (tensor<2x3xi32>) -> tensor<6xi32>
    %c_9 = stablehlo.constant dense<0> : tensor<i32>
    %27 = stablehlo.broadcast_in_dim %c_9, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %28 = stablehlo.compare GE, %26, %27, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %29 = call @cumsum(%28) : (tensor<6xi1>) -> tensor<6xi32>
    %c_10 = stablehlo.constant dense<0> : tensor<i32>
    %30 = stablehlo.broadcast_in_dim %c_10, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %c_11 = stablehlo.constant dense<0> : tensor<i32>
    %31 = call @clip(%29, %c_11) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>
    %c_12 = stablehlo.constant dense<0> : tensor<i32>
    %32 = stablehlo.broadcast_in_dim %c_12, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %33 = stablehlo.compare LT, %31, %32, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_13 = stablehlo.constant dense<6> : tensor<i32>
    %34 = stablehlo.broadcast_in_dim %c_13, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %35 = stablehlo.add %31, %34 : tensor<6xi32>
    %36 = stablehlo.select %33, %35, %31 : tensor<6xi1>, tensor<6xi32>
    %37 = stablehlo.broadcast_in_dim %36, dims = [0] : (tensor<6xi32>) -> tensor<6x1xi32>
    %c_14 = stablehlo.constant dense<1> : tensor<i32>
    %38 = stablehlo.broadcast_in_dim %c_14, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %39 = "stablehlo.scatter"(%30, %37, %38) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%arg7: tensor<i32>, %arg8: tensor<i32>):
      %129 = stablehlo.add %arg7, %arg8 : tensor<i32>
      stablehlo.return %129 : tensor<i32>
    }) : (tensor<6xi32>, tensor<6x1xi32>, tensor<6xi32>) -> tensor<6xi32>
    %40 = call @cumsum_1(%39) : (tensor<6xi32>) -> tensor<6xi32>
    %c_15 = stablehlo.constant dense<1> : tensor<i32>
    %41 = call @floor_divide(%40, %c_15) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>
    %c_16 = stablehlo.constant dense<6> : tensor<i32>
    %42 = call @remainder(%41, %c_16) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>
    %43 = stablehlo.iota dim = 0 : tensor<6xi32>
    %44 = stablehlo.convert %28 : (tensor<6xi1>) -> tensor<6xi32>
    %c_17 = stablehlo.constant dense<0> : tensor<i32>
    %45 = stablehlo.reduce(%44 init: %c_17) applies stablehlo.add across dimensions = [0] : (tensor<6xi32>, tensor<i32>) -> tensor<i32>
    %46 = stablehlo.broadcast_in_dim %45, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %47 = stablehlo.compare GE, %43, %46, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_18 = stablehlo.constant dense<6> : tensor<i32>
    %48 = call @_where_3(%47, %c_18, %42) : (tensor<6xi1>, tensor<i32>, tensor<6xi32>) -> tensor<6xi32>
    %49 = call @_take(%26, %48) : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi32>
    %50 = stablehlo.reshape %49 : (tensor<6xi32>) -> tensor<2x3xi32>
    %c_19 = stablehlo.constant dense<0> : tensor<i32>
    %51 = stablehlo.broadcast_in_dim %c_19, dims = [] : (tensor<i32>) -> tensor<2x4xi32>
    %52 = stablehlo.compare GE, %arg5, %51, SIGNED : (tensor<2x4xi32>, tensor<2x4xi32>) -> tensor<2x4xi1>
    %53 = stablehlo.iota dim = 0 : tensor<2xi32>
    %c_20 = stablehlo.constant dense<1024> : tensor<i32>
    %54 = stablehlo.broadcast_in_dim %c_20, dims = [] : (tensor<i32>) -> tensor<2xi32>
    %55 = stablehlo.multiply %53, %54 : tensor<2xi32>
    %56 = stablehlo.broadcast_in_dim %55, dims = [0] : (tensor<2xi32>) -> tensor<2x1xi32>
    %57 = stablehlo.broadcast_in_dim %56, dims = [0, 1] : (tensor<2x1xi32>) -> tensor<2x4xi32>
    %58 = stablehlo.add %arg5, %57 : tensor<2x4xi32>
    %59 = call @_where_4(%52, %58, %arg5) : (tensor<2x4xi1>, tensor<2x4xi32>, tensor<2x4xi32>) -> tensor<2x4xi32>
    %c_21 = stablehlo.constant dense<0> : tensor<i32>
    %60 = stablehlo.broadcast_in_dim %c_21, dims = [] : (tensor<i32>) -> tensor<2x4xi32>
    %61 = stablehlo.compare GE, %arg6, %60, SIGNED : (tensor<2x4xi32>, tensor<2x4xi32>) -> tensor<2x4xi1>
    %62 = stablehlo.iota dim = 0 : tensor<2xi32>
    %c_22 = stablehlo.constant dense<1024> : tensor<i32>
    %63 = stablehlo.broadcast_in_dim %c_22, dims = [] : (tensor<i32>) -> tensor<2xi32>
    %64 = stablehlo.multiply %62, %63 : tensor<2xi32>
    %65 = stablehlo.broadcast_in_dim %64, dims = [0] : (tensor<2xi32>) -> tensor<2x1xi32>
    %66 = stablehlo.broadcast_in_dim %65, dims = [0, 1] : (tensor<2x1xi32>) -> tensor<2x4xi32>
    %67 = stablehlo.add %arg6, %66 : tensor<2x4xi32>
    %68 = call @_where_4(%61, %67, %arg6) : (tensor<2x4xi1>, tensor<2x4xi32>, tensor<2x4xi32>) -> tensor<2x4xi32>
    %69 = stablehlo.reshape %59 : (tensor<2x4xi32>) -> tensor<8xi32>
    %c_23 = stablehlo.constant dense<0> : tensor<i32>
    %70 = stablehlo.broadcast_in_dim %c_23, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %71 = stablehlo.compare GE, %69, %70, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %72 = call @cumsum_5(%71) : (tensor<8xi1>) -> tensor<8xi32>
    %c_24 = stablehlo.constant dense<0> : tensor<i32>
    %73 = stablehlo.broadcast_in_dim %c_24, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %c_25 = stablehlo.constant dense<0> : tensor<i32>
    %74 = call @clip_7(%72, %c_25) : (tensor<8xi32>, tensor<i32>) -> tensor<8xi32>
    %c_26 = stablehlo.constant dense<0> : tensor<i32>
    %75 = stablehlo.broadcast_in_dim %c_26, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %76 = stablehlo.compare LT, %74, %75, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_27 = stablehlo.constant dense<8> : tensor<i32>
    %77 = stablehlo.broadcast_in_dim %c_27, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %78 = stablehlo.add %74, %77 : tensor<8xi32>
    %79 = stablehlo.select %76, %78, %74 : tensor<8xi1>, tensor<8xi32>
    %80 = stablehlo.broadcast_in_dim %79, dims = [0] : (tensor<8xi32>) -> tensor<8x1xi32>
    %c_28 = stablehlo.constant dense<1> : tensor<i32>
    %81 = stablehlo.broadcast_in_dim %c_28, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %82 = "stablehlo.scatter"(%73, %80, %81) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%arg7: tensor<i32>, %arg8: tensor<i32>):
      %129 = stablehlo.add %arg7, %arg8 : tensor<i32>
      stablehlo.return %129 : tensor<i32>
    }) : (tensor<8xi32>, tensor<8x1xi32>, tensor<8xi32>) -> tensor<8xi32>
    %83 = call @cumsum_8(%82) : (tensor<8xi32>) -> tensor<8xi32>
    %c_29 = stablehlo.constant dense<1> : tensor<i32>
    %84 = call @floor_divide_9(%83, %c_29) : (tensor<8xi32>, tensor<i32>) -> tensor<8xi32>
    %c_30 = stablehlo.constant dense<8> : tensor<i32>
    %85 = call @remainder_11(%84, %c_30) : (tensor<8xi32>, tensor<i32>) -> tensor<8xi32>
    %86 = stablehlo.iota dim = 0 : tensor<8xi32>
    %87 = stablehlo.convert %71 : (tensor<8xi1>) -> tensor<8xi32>
    %c_31 = stablehlo.constant dense<0> : tensor<i32>
    %88 = stablehlo.reduce(%87 init: %c_31) applies stablehlo.add across dimensions = [0] : (tensor<8xi32>, tensor<i32>) -> tensor<i32>
    %89 = stablehlo.broadcast_in_dim %88, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %90 = stablehlo.compare GE, %86, %89, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_32 = stablehlo.constant dense<8> : tensor<i32>
    %91 = call @_where_12(%90, %c_32, %85) : (tensor<8xi1>, tensor<i32>, tensor<8xi32>) -> tensor<8xi32>
    %92 = call @_take_13(%69, %91) : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    %93 = stablehlo.reshape %92 : (tensor<8xi32>) -> tensor<2x4xi32>
    %94 = stablehlo.reshape %68 : (tensor<2x4xi32>) -> tensor<8xi32>
    %c_33 = stablehlo.constant dense<0> : tensor<i32>
    %95 = stablehlo.broadcast_in_dim %c_33, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %96 = stablehlo.compare GE, %94, %95, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %97 = call @cumsum_5(%96) : (tensor<8xi1>) -> tensor<8xi32>
    %c_34 = stablehlo.constant dense<0> : tensor<i32>
    %98 = stablehlo.broadcast_in_dim %c_34, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %c_35 = stablehlo.constant dense<0> : tensor<i32>
    %99 = call @clip_7(%97, %c_35) : (tensor<8xi32>, tensor<i32>) -> tensor<8xi32>
    %c_36 = stablehlo.constant dense<0> : tensor<i32>
    %100 = stablehlo.broadcast_in_dim %c_36, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %101 = stablehlo.compare LT, %99, %100, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_37 = stablehlo.constant dense<8> : tensor<i32>
    %102 = stablehlo.broadcast_in_dim %c_37, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %103 = stablehlo.add %99, %102 : tensor<8xi32>
    %104 = stablehlo.select %101, %103, %99 : tensor<8xi1>, tensor<8xi32>
    %105 = stablehlo.broadcast_in_dim %104, dims = [0] : (tensor<8xi32>) -> tensor<8x1xi32>
    %c_38 = stablehlo.constant dense<1> : tensor<i32>
    %106 = stablehlo.broadcast_in_dim %c_38, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %107 = "stablehlo.scatter"(%98, %105, %106) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%arg7: tensor<i32>, %arg8: tensor<i32>):
      %129 = stablehlo.add %arg7, %arg8 : tensor<i32>
      stablehlo.return %129 : tensor<i32>
    }) : (tensor<8xi32>, tensor<8x1xi32>, tensor<8xi32>) -> tensor<8xi32>
    %108 = call @cumsum_8(%107) : (tensor<8xi32>) -> tensor<8xi32>
    %c_39 = stablehlo.constant dense<1> : tensor<i32>
    %109 = call @floor_divide_9(%108, %c_39) : (tensor<8xi32>, tensor<i32>) -> tensor<8xi32>
    %c_40 = stablehlo.constant dense<8> : tensor<i32>
    %110 = call @remainder_11(%109, %c_40) : (tensor<8xi32>, tensor<i32>) -> tensor<8xi32>
    %111 = stablehlo.iota dim = 0 : tensor<8xi32>
    %112 = stablehlo.convert %96 : (tensor<8xi1>) -> tensor<8xi32>
    %c_41 = stablehlo.constant dense<0> : tensor<i32>
    %113 = stablehlo.reduce(%112 init: %c_41) applies stablehlo.add across dimensions = [0] : (tensor<8xi32>, tensor<i32>) -> tensor<i32>
    %114 = stablehlo.broadcast_in_dim %113, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %115 = stablehlo.compare GE, %111, %114, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_42 = stablehlo.constant dense<8> : tensor<i32>
    %116 = call @_where_12(%115, %c_42, %110) : (tensor<8xi1>, tensor<i32>, tensor<8xi32>) -> tensor<8xi32>
    %117 = call @_take_13(%94, %116) : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    %118 = stablehlo.reshape %117 : (tensor<8xi32>) -> tensor<2x4xi32>
    %c_43 = stablehlo.constant dense<8> : tensor<i32>
    %119 = stablehlo.broadcast_in_dim %c_43, dims = [] : (tensor<i32>) -> tensor<2x4xi32>
    %120 = stablehlo.multiply %93, %119 : tensor<2x4xi32>
    %c_44 = stablehlo.constant dense<128> : tensor<i32>
    %121 = stablehlo.broadcast_in_dim %c_44, dims = [] : (tensor<i32>) -> tensor<2x4xi32>
    %122 = stablehlo.multiply %120, %121 : tensor<2x4xi32>
    %c_45 = stablehlo.constant dense<2> : tensor<i32>
    %123 = stablehlo.broadcast_in_dim %c_45, dims = [] : (tensor<i32>) -> tensor<2x4xi32>
    %124 = stablehlo.multiply %118, %123 : tensor<2x4xi32>
    %c_46 = stablehlo.constant dense<128> : tensor<i32>
    %125 = stablehlo.broadcast_in_dim %c_46, dims = [] : (tensor<i32>) -> tensor<2x4xi32>
    %126 = stablehlo.multiply %124, %125 : tensor<2x4xi32>
    %127:2 = stablehlo.custom_call @__cudnn$fmhaSoftmax(%arg0, %arg1, %arg2, %25, %50, %122, %126) {api_version = 2 : i32, backend_config = "{\22operation_queue_id\22: \220\22, \22cudnn_fmha_backend_config\22: {\22algorithm\22: {\22algo_id\22: \220\22, \22math_type\22: \22TENSOR_OP_MATH\22, \22tuning_knobs\22: {\2217\22: \221\22, \2224\22: \220\22}, \22is_cudnn_frontend\22: true, \22workspace_size\22: \220\22}, \22fmha_scale\22: 1.0, \22intermediate_tensor_shape\22: {\22element_type\22: \22BF16\22, \22dimensions\22: [\222\22, \228\22, \221024\22, \221024\22], \22tuple_shapes\22: [], \22layout\22: {\22dim_level_types\22: [], \22dim_unique\22: [], \22dim_ordered\22: [], \22minor_to_major\22: [\223\22, \222\22, \221\22, \220\22], \22tiles\22: [], \22element_size_in_bits\22: \220\22, \22memory_space\22: \220\22, \22index_primitive_type\22: \22PRIMITIVE_TYPE_INVALID\22, \22pointer_primitive_type\22: \22PRIMITIVE_TYPE_INVALID\22, \22dynamic_shape_metadata_prefix_bytes\22: \220\22}, \22is_dynamic_dimension\22: [false, false, false, false]}, \22is_flash_attention\22: true, \22mask_type\22: \22PADDING_CAUSAL\22, \22bmm1_dot_dimension_numbers\22: {\22lhs_contracting_dimensions\22: [\223\22], \22rhs_contracting_dimensions\22: [\223\22], \22lhs_batch_dimensions\22: [\220\22, \222\22], \22rhs_batch_dimensions\22: [\220\22, \222\22]}, \22bmm2_dot_dimension_numbers\22: {\22lhs_contracting_dimensions\22: [\223\22], \22rhs_contracting_dimensions\22: [\221\22], \22lhs_batch_dimensions\22: [\220\22, \221\22], \22rhs_batch_dimensions\22: [\220\22, \222\22]}, \22dropout_rate\22: 0.0, \22seed\22: 42, \22sliding_window_length\22: 256, \22max_seg_per_batch\22: 3, \22is_paged_attention\22: false}}", operand_layouts = [dense<[3, 2, 1, 0]> : tensor<4xindex>, dense<[3, 2, 1, 0]> : tensor<4xindex>, dense<[3, 2, 1, 0]> : tensor<4xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[3, 1, 2, 0]> : tensor<4xindex>, dense<0> : tensor<1xindex>]} : (tensor<2x1024x8x128xbf16>, tensor<2x1024x2x128xbf16>, tensor<2x1024x2x128xbf16>, tensor<2x3xi32>, tensor<2x3xi32>, tensor<2x4xi32>, tensor<2x4xi32>) -> (tensor<2x8x1024x128xbf16>, tensor<0xui8>)
    %128 = stablehlo.transpose %127#0, dims = [0, 2, 1, 3] : (tensor<2x8x1024x128xbf16>) -> tensor<2x1024x8x128xbf16>
    return %128 : tensor<2x1024x8x128xbf16>
  }
  func.func private @cumsum(%arg0: tensor<6xi1>) -> tensor<6xi32> {
    %0 = stablehlo.convert %arg0 : (tensor<6xi1>) -> tensor<6xi32>
    %1 = call @cumsum_0(%0) : (tensor<6xi32>) -> tensor<6xi32>
    return %1 : tensor<6xi32>
  }
  func.func private @cumsum_0(%arg0: tensor<6xi32>) -> tensor<6xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0:2 = chlo.scan(%arg0) inits (%c) dimension=0  attributes {is_associative = true, is_reverse = false} {
    ^bb0(%input: tensor<i32>, %carry: tensor<i32>):
      %1 = stablehlo.add %input, %carry : tensor<i32>
      stablehlo.return %1, %1 : tensor<i32>, tensor<i32>
    } : (tensor<6xi32>, tensor<i32>) -> (tensor<6xi32>, tensor<i32>)
    return %0#0 : tensor<6xi32>
  }
  func.func private @clip(%arg0: tensor<6xi32>, %arg1: tensor<i32>) -> tensor<6xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %2 = stablehlo.maximum %1, %arg0 : tensor<6xi32>
    return %2 : tensor<6xi32>
  }
  func.func private @cumsum_1(%arg0: tensor<6xi32>) -> tensor<6xi32> {
    %0 = call @cumsum_0(%arg0) : (tensor<6xi32>) -> tensor<6xi32>
    return %0 : tensor<6xi32>
  }
  func.func private @floor_divide(%arg0: tensor<6xi32>, %arg1: tensor<i32>) -> tensor<6xi32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %1 = stablehlo.divide %arg0, %0 : tensor<6xi32>
    %2 = stablehlo.sign %arg0 : tensor<6xi32>
    %3 = stablehlo.sign %arg1 : tensor<i32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %5 = stablehlo.compare NE, %2, %4, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %6 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %7 = stablehlo.remainder %arg0, %6 : tensor<6xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %8 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %9 = stablehlo.compare NE, %7, %8, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %10 = stablehlo.and %5, %9 : tensor<6xi1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %11 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %12 = stablehlo.subtract %1, %11 : tensor<6xi32>
    %13 = call @_where(%10, %12, %1) : (tensor<6xi1>, tensor<6xi32>, tensor<6xi32>) -> tensor<6xi32>
    return %13 : tensor<6xi32>
  }
  func.func private @_where(%arg0: tensor<6xi1>, %arg1: tensor<6xi32>, %arg2: tensor<6xi32>) -> tensor<6xi32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<6xi1>, tensor<6xi32>
    return %0 : tensor<6xi32>
  }
  func.func private @remainder(%arg0: tensor<6xi32>, %arg1: tensor<i32>) -> tensor<6xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare EQ, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = call @_where_2(%1, %c_0, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %3 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %4 = stablehlo.remainder %arg0, %3 : tensor<6xi32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %c_1, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %6 = stablehlo.compare NE, %4, %5, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %7 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %8 = stablehlo.compare LT, %4, %7, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.compare LT, %2, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %10 = stablehlo.broadcast_in_dim %9, dims = [] : (tensor<i1>) -> tensor<6xi1>
    %11 = stablehlo.compare NE, %8, %10, UNSIGNED : (tensor<6xi1>, tensor<6xi1>) -> tensor<6xi1>
    %12 = stablehlo.and %11, %6 : tensor<6xi1>
    %13 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %14 = stablehlo.add %4, %13 : tensor<6xi32>
    %15 = stablehlo.select %12, %14, %4 : tensor<6xi1>, tensor<6xi32>
    return %15 : tensor<6xi32>
  }
  func.func private @_where_2(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @_where_3(%arg0: tensor<6xi1>, %arg1: tensor<i32>, %arg2: tensor<6xi32>) -> tensor<6xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %2 = stablehlo.select %arg0, %1, %arg2 : tensor<6xi1>, tensor<6xi32>
    return %2 : tensor<6xi32>
  }
  func.func private @_take(%arg0: tensor<6xi32>, %arg1: tensor<6xi32>) -> tensor<6xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %1 = stablehlo.compare LT, %arg1, %0, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_0 = stablehlo.constant dense<6> : tensor<i32>
    %2 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %3 = stablehlo.add %arg1, %2 : tensor<6xi32>
    %4 = call @_where(%1, %3, %arg1) : (tensor<6xi1>, tensor<6xi32>, tensor<6xi32>) -> tensor<6xi32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [0] : (tensor<6xi32>) -> tensor<6x1xi32>
    %c_1 = stablehlo.constant dense<5> : tensor<1xi32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %6 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<6x1xi32>
    %7 = stablehlo.compare GE, %5, %6, SIGNED : (tensor<6x1xi32>, tensor<6x1xi32>) -> tensor<6x1xi1>
    %8 = stablehlo.broadcast_in_dim %c_1, dims = [1] : (tensor<1xi32>) -> tensor<1x1xi32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [0, 1] : (tensor<1x1xi32>) -> tensor<6x1xi32>
    %10 = stablehlo.compare LE, %5, %9, SIGNED : (tensor<6x1xi32>, tensor<6x1xi32>) -> tensor<6x1xi1>
    %11 = stablehlo.and %7, %10 : tensor<6x1xi1>
    %c_3 = stablehlo.constant dense<true> : tensor<i1>
    %12 = stablehlo.reduce(%11 init: %c_3) applies stablehlo.and across dimensions = [1] : (tensor<6x1xi1>, tensor<i1>) -> tensor<6xi1>
    %13 = "stablehlo.gather"(%arg0, %5) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<6xi32>, tensor<6x1xi32>) -> tensor<6xi32>
    %c_4 = stablehlo.constant dense<0> : tensor<i32>
    %14 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %15 = stablehlo.select %12, %13, %14 : tensor<6xi1>, tensor<6xi32>
    return %15 : tensor<6xi32>
  }
  func.func private @_where_4(%arg0: tensor<2x4xi1>, %arg1: tensor<2x4xi32>, %arg2: tensor<2x4xi32>) -> tensor<2x4xi32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<2x4xi1>, tensor<2x4xi32>
    return %0 : tensor<2x4xi32>
  }
  func.func private @cumsum_5(%arg0: tensor<8xi1>) -> tensor<8xi32> {
    %0 = stablehlo.convert %arg0 : (tensor<8xi1>) -> tensor<8xi32>
    %1 = call @cumsum_6(%0) : (tensor<8xi32>) -> tensor<8xi32>
    return %1 : tensor<8xi32>
  }
  func.func private @cumsum_6(%arg0: tensor<8xi32>) -> tensor<8xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0:2 = chlo.scan(%arg0) inits (%c) dimension=0  attributes {is_associative = true, is_reverse = false} {
    ^bb0(%input: tensor<i32>, %carry: tensor<i32>):
      %1 = stablehlo.add %input, %carry : tensor<i32>
      stablehlo.return %1, %1 : tensor<i32>, tensor<i32>
    } : (tensor<8xi32>, tensor<i32>) -> (tensor<8xi32>, tensor<i32>)
    return %0#0 : tensor<8xi32>
  }
  func.func private @clip_7(%arg0: tensor<8xi32>, %arg1: tensor<i32>) -> tensor<8xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %2 = stablehlo.maximum %1, %arg0 : tensor<8xi32>
    return %2 : tensor<8xi32>
  }
  func.func private @cumsum_8(%arg0: tensor<8xi32>) -> tensor<8xi32> {
    %0 = call @cumsum_6(%arg0) : (tensor<8xi32>) -> tensor<8xi32>
    return %0 : tensor<8xi32>
  }
  func.func private @floor_divide_9(%arg0: tensor<8xi32>, %arg1: tensor<i32>) -> tensor<8xi32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %1 = stablehlo.divide %arg0, %0 : tensor<8xi32>
    %2 = stablehlo.sign %arg0 : tensor<8xi32>
    %3 = stablehlo.sign %arg1 : tensor<i32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %5 = stablehlo.compare NE, %2, %4, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %6 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %7 = stablehlo.remainder %arg0, %6 : tensor<8xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %8 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %9 = stablehlo.compare NE, %7, %8, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %10 = stablehlo.and %5, %9 : tensor<8xi1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %11 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %12 = stablehlo.subtract %1, %11 : tensor<8xi32>
    %13 = call @_where_10(%10, %12, %1) : (tensor<8xi1>, tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    return %13 : tensor<8xi32>
  }
  func.func private @_where_10(%arg0: tensor<8xi1>, %arg1: tensor<8xi32>, %arg2: tensor<8xi32>) -> tensor<8xi32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<8xi1>, tensor<8xi32>
    return %0 : tensor<8xi32>
  }
  func.func private @remainder_11(%arg0: tensor<8xi32>, %arg1: tensor<i32>) -> tensor<8xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare EQ, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = call @_where_2(%1, %c_0, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %3 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %4 = stablehlo.remainder %arg0, %3 : tensor<8xi32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %c_1, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %6 = stablehlo.compare NE, %4, %5, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %7 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %8 = stablehlo.compare LT, %4, %7, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.compare LT, %2, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %10 = stablehlo.broadcast_in_dim %9, dims = [] : (tensor<i1>) -> tensor<8xi1>
    %11 = stablehlo.compare NE, %8, %10, UNSIGNED : (tensor<8xi1>, tensor<8xi1>) -> tensor<8xi1>
    %12 = stablehlo.and %11, %6 : tensor<8xi1>
    %13 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %14 = stablehlo.add %4, %13 : tensor<8xi32>
    %15 = stablehlo.select %12, %14, %4 : tensor<8xi1>, tensor<8xi32>
    return %15 : tensor<8xi32>
  }
  func.func private @_where_12(%arg0: tensor<8xi1>, %arg1: tensor<i32>, %arg2: tensor<8xi32>) -> tensor<8xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %2 = stablehlo.select %arg0, %1, %arg2 : tensor<8xi1>, tensor<8xi32>
    return %2 : tensor<8xi32>
  }
  func.func private @_take_13(%arg0: tensor<8xi32>, %arg1: tensor<8xi32>) -> tensor<8xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %1 = stablehlo.compare LT, %arg1, %0, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_0 = stablehlo.constant dense<8> : tensor<i32>
    %2 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %3 = stablehlo.add %arg1, %2 : tensor<8xi32>
    %4 = call @_where_10(%1, %3, %arg1) : (tensor<8xi1>, tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [0] : (tensor<8xi32>) -> tensor<8x1xi32>
    %c_1 = stablehlo.constant dense<7> : tensor<1xi32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %6 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<8x1xi32>
    %7 = stablehlo.compare GE, %5, %6, SIGNED : (tensor<8x1xi32>, tensor<8x1xi32>) -> tensor<8x1xi1>
    %8 = stablehlo.broadcast_in_dim %c_1, dims = [1] : (tensor<1xi32>) -> tensor<1x1xi32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [0, 1] : (tensor<1x1xi32>) -> tensor<8x1xi32>
    %10 = stablehlo.compare LE, %5, %9, SIGNED : (tensor<8x1xi32>, tensor<8x1xi32>) -> tensor<8x1xi1>
    %11 = stablehlo.and %7, %10 : tensor<8x1xi1>
    %c_3 = stablehlo.constant dense<true> : tensor<i1>
    %12 = stablehlo.reduce(%11 init: %c_3) applies stablehlo.and across dimensions = [1] : (tensor<8x1xi1>, tensor<i1>) -> tensor<8xi1>
    %13 = "stablehlo.gather"(%arg0, %5) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<8xi32>, tensor<8x1xi32>) -> tensor<8xi32>
    %c_4 = stablehlo.constant dense<2048> : tensor<i32>
    %14 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %15 = stablehlo.select %12, %13, %14 : tensor<8xi1>, tensor<8xi32>
    return %15 : tensor<8xi32>
  }
}

