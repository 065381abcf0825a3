"""kda_decode: one decoding step of Kimi Delta Attention with the bounded ("safe") gate, as
tilelang's examples/kda/example_safe_gated_kda_decode.py writes it. The kernel reads the
post-convolution packed QKV projection of one token per request, L2-normalizes q and k (q
scaled by key_dim**-0.5), makes the per-channel gate exp(lower_bound * sigmoid(exp(A_log) *
(a + dt_bias))) and beta = sigmoid(b), and runs the delta rule on the request's recurrent
state, picked from a slot pool by state_indices (-1: a dummy request, output zero, no state
touched): S <- S * decay; delta = beta (v - S k); S <- S + delta k^T; o = S q. One block per
block_v rows of one value head's state and request; no loop, no shared memory.

Departures from the example: the state pool, which the example updates in place, is an
input (State_in) and an output (State): a tuner launches a candidate many times on the same
arguments and fills outputs with NaN before its check. Since the kernel writes only the
slots that some request names, inputs() makes every slot active in exactly one request
(num_slots <= batch; the other batch - num_slots requests are dummies), so that every
element of State is written. Its out_idx output (Output) is an argument. scale is
key_dim**-0.5, the example's default. The example has no autotuner: PARAMS spans the
block_v values of the example and its tests (16, 8) and 32, and threads 128 (its only
value) and 256.

For a schedule tuner: a memory-bound kernel with no pipelined loop and no shared memory:
every global read goes straight into registers, so there is nothing for a producer warp to
hand over.

    ws-tune tests/data/kda_decode.py --shape batch=64,num_slots=48
"""

import tilelang.language as T

# GLM-5.3-Flash TP8 (the example's main): 8 q/k heads and 8 value heads of 128
PROBLEM = {"batch": None, "num_slots": None, "num_q_heads": 8, "num_value_heads": 8, "key_dim": 128, "value_dim": 128,
           "input_dtype": "bfloat16", "state_dtype": "float32", "lower_bound": -5.0}  # fmt: skip
CHOICES = {"input_dtype": ["bfloat16", "float16"], "state_dtype": ["float32", "bfloat16"]}
PARAMS = {"block_v": [8, 16, 32], "threads": [128, 256]}
OUTPUTS = [7, 8]  # Output, State
TOLERANCE = [2e-2, 1e-2]


def check(problem, params, schedule):
    if problem["num_value_heads"] % problem["num_q_heads"]:
        return f"num_value_heads={problem['num_value_heads']} is not a multiple of num_q_heads={problem['num_q_heads']}"
    if problem["value_dim"] % params["block_v"]:
        return f"value_dim={problem['value_dim']} is not a multiple of block_v={params['block_v']}"
    if problem["lower_bound"] >= 0:
        return f"lower_bound={problem['lower_bound']} is not negative (the safe gate needs it)"
    if problem["num_slots"] > problem["batch"]:
        return f"num_slots={problem['num_slots']} > batch={problem['batch']}: some slot of State would be left unwritten"
    return None


def kernel(problem, *, block_v, threads):
    batch, num_slots, num_q_heads, num_value_heads, key_dim, value_dim = (
        problem[k] for k in ("batch", "num_slots", "num_q_heads", "num_value_heads", "key_dim", "value_dim"))  # fmt: skip
    input_dtype, state_dtype, lower_bound = problem["input_dtype"], problem["state_dtype"], problem["lower_bound"]
    scale = key_dim**-0.5
    packed_qkv_dim = 2 * num_q_heads * key_dim + num_value_heads * value_dim
    head_group_size = num_value_heads // num_q_heads
    accum_dtype = T.float32

    @T.prim_func
    def kda_decode(
        MixedQKV: T.Tensor((batch, packed_qkv_dim), input_dtype),
        A: T.Tensor((batch, num_value_heads * key_dim), input_dtype),
        B: T.Tensor((batch, num_value_heads), input_dtype),
        A_log: T.Tensor((num_value_heads,), T.float32),
        DTBias: T.Tensor((num_value_heads * key_dim,), T.float32),
        State_in: T.Tensor((num_slots, num_value_heads, value_dim, key_dim), state_dtype),
        StateIndices: T.Tensor((batch,), T.int32),
        Output: T.Tensor((batch, 1, num_value_heads, value_dim), input_dtype),
        State: T.Tensor((num_slots, num_value_heads, value_dim, key_dim), state_dtype),
    ):
        with T.Kernel(value_dim // block_v, batch, num_value_heads, threads=threads) as (i_v, i_b, i_hv):
            state_slot = T.alloc_var(T.int64)
            state_slot = T.Cast(T.int64, StateIndices[i_b])
            value_offset = i_v * block_v

            # an invalid slot must never address State (the example's defensive guard)
            if state_slot < 0 or state_slot >= num_slots:
                for i in T.Parallel(block_v):
                    Output[i_b, 0, i_hv, value_offset + i] = T.Cast(input_dtype, 0.0)
            else:
                qk_head = i_hv // head_group_size
                q_offset = qk_head * key_dim
                k_offset = num_q_heads * key_dim + q_offset
                v_offset = 2 * num_q_heads * key_dim + i_hv * value_dim + value_offset
                gate_offset = i_hv * key_dim

                q = T.alloc_fragment((1, key_dim), accum_dtype)
                k = T.alloc_fragment((1, key_dim), accum_dtype)
                norm_terms = T.alloc_fragment((1, key_dim), accum_dtype)
                norm = T.alloc_fragment((1,), accum_dtype)
                decay = T.alloc_fragment((1, key_dim), accum_dtype)
                h = T.alloc_fragment((block_v, key_dim), accum_dtype)
                products = T.alloc_fragment((block_v, key_dim), accum_dtype)
                delta = T.alloc_fragment((block_v,), accum_dtype)
                output = T.alloc_fragment((block_v,), accum_dtype)
                beta = T.alloc_var(accum_dtype)
                a_log = T.alloc_var(accum_dtype)

                for j in T.Parallel(key_dim):
                    q[0, j] = T.Cast(accum_dtype, MixedQKV[i_b, q_offset + j])
                    norm_terms[0, j] = q[0, j] * q[0, j]
                T.reduce_sum(norm_terms, norm, dim=1)
                for j in T.Parallel(key_dim):
                    q[0, j] = q[0, j] * T.rsqrt(norm[0] + 1e-6) * scale

                for j in T.Parallel(key_dim):
                    k[0, j] = T.Cast(accum_dtype, MixedQKV[i_b, k_offset + j])
                    norm_terms[0, j] = k[0, j] * k[0, j]
                T.reduce_sum(norm_terms, norm, dim=1)
                for j in T.Parallel(key_dim):
                    k[0, j] = k[0, j] * T.rsqrt(norm[0] + 1e-6)

                a_log = T.Cast(accum_dtype, A_log[i_hv])
                beta = T.sigmoid(T.Cast(accum_dtype, B[i_b, i_hv]))
                for j in T.Parallel(key_dim):
                    gate_input = T.Cast(accum_dtype, A[i_b, gate_offset + j]) + T.Cast(accum_dtype, DTBias[gate_offset + j])
                    log_decay = lower_bound * T.sigmoid(T.exp(a_log) * gate_input)
                    decay[0, j] = T.exp(log_decay)

                for i, j in T.Parallel(block_v, key_dim):
                    h[i, j] = T.Cast(accum_dtype, State_in[state_slot, i_hv, value_offset + i, j]) * decay[0, j]
                    products[i, j] = h[i, j] * k[0, j]
                T.reduce_sum(products, delta, dim=1)

                for i in T.Parallel(block_v):
                    delta[i] = (T.Cast(accum_dtype, MixedQKV[i_b, v_offset + i]) - delta[i]) * beta
                for i, j in T.Parallel(block_v, key_dim):
                    h[i, j] = h[i, j] + delta[i] * k[0, j]
                    products[i, j] = h[i, j] * q[0, j]
                T.reduce_sum(products, output, dim=1)

                for i, j in T.Parallel(block_v, key_dim):
                    State[state_slot, i_hv, value_offset + i, j] = T.Cast(state_dtype, h[i, j])
                for i in T.Parallel(block_v):
                    Output[i_b, 0, i_hv, value_offset + i] = T.Cast(input_dtype, output[i])

    return kda_decode


def inputs(problem, device):
    import torch

    batch, num_slots, hq, hv, dk, dv = (
        problem[k] for k in ("batch", "num_slots", "num_q_heads", "num_value_heads", "key_dim", "value_dim"))  # fmt: skip
    dtype, state_dtype = getattr(torch, problem["input_dtype"]), getattr(torch, problem["state_dtype"])
    # as the example's tests make them: bf16 N(0, 1) projections, fp32 A_log and dt_bias
    mixed_qkv = torch.randn(batch, 2 * hq * dk + hv * dv, device=device, dtype=dtype)
    a = torch.randn(batch, hv * dk, device=device, dtype=dtype)
    b = torch.randn(batch, hv, device=device, dtype=dtype)
    a_log = torch.linspace(-2.0, 0.0, hv, device=device)
    dt_bias = torch.randn(hv * dk, device=device) * 0.1
    state_in = (torch.randn(num_slots, hv, dv, dk, device=device) * 0.1).to(state_dtype)
    # every slot owned by exactly one request, at random places; the others are dummies (-1)
    indices = torch.full((batch,), -1, dtype=torch.int32)
    indices[torch.randperm(batch)[:num_slots]] = torch.randperm(num_slots, dtype=torch.int32)
    output = torch.empty(batch, 1, hv, dv, device=device, dtype=dtype)
    state = torch.empty(num_slots, hv, dv, dk, device=device, dtype=state_dtype)
    return [mixed_qkv, a, b, a_log, dt_bias, state_in, indices.to(device), output, state]


def reference(problem, args):
    import torch

    mixed_qkv, a, b, a_log, dt_bias, state_in, indices, output, state = args
    batch, hq, hv, dk, dv = (problem[k] for k in ("batch", "num_q_heads", "num_value_heads", "key_dim", "value_dim"))
    q = mixed_qkv[:, : hq * dk].view(batch, hq, dk).float()
    k = mixed_qkv[:, hq * dk : 2 * hq * dk].view(batch, hq, dk).float()
    v = mixed_qkv[:, 2 * hq * dk :].view(batch, hv, dv).float()
    q = q * torch.rsqrt(q.square().sum(-1, keepdim=True) + 1e-6) * dk**-0.5
    k = k * torch.rsqrt(k.square().sum(-1, keepdim=True) + 1e-6)
    q, k = (x.repeat_interleave(hv // hq, dim=1) for x in (q, k))  # (batch, hv, dk)
    gate = a.view(batch, hv, dk).float() + dt_bias.view(hv, dk)
    decay = torch.exp(problem["lower_bound"] * torch.sigmoid(torch.exp(a_log)[:, None] * gate))
    beta = torch.sigmoid(b.float())  # (batch, hv)

    active = indices >= 0
    slots = indices[active].long()
    h = state_in[slots].float() * decay[active][:, :, None, :]  # (n, hv, dv, dk)
    delta = (v[active] - (h * k[active][:, :, None, :]).sum(-1)) * beta[active][..., None]
    h = h + delta[..., None] * k[active][:, :, None, :]
    out = torch.zeros(batch, 1, hv, dv, device=mixed_qkv.device)
    out[active, 0] = (h * q[active][:, :, None, :]).sum(-1)
    new_state = torch.empty_like(state_in, dtype=torch.float32)
    new_state[slots] = h
    return [out.to(output.dtype), new_state.to(state.dtype)]


def _active(problem):
    return min(problem["batch"], problem["num_slots"])


def flops(problem):
    # per active request and value head, over its value_dim x key_dim state: decay, S k
    # (multiply, add), the rank-one update (multiply, add) and S q (multiply, add)
    return 7.0 * _active(problem) * problem["num_value_heads"] * problem["value_dim"] * problem["key_dim"]


def bytes_moved(problem):
    batch, hq, hv, dk, dv = (problem[k] for k in ("batch", "num_q_heads", "num_value_heads", "key_dim", "value_dim"))
    size = {"bfloat16": 2, "float16": 2, "float32": 4}
    x, s = size[problem["input_dtype"]], size[problem["state_dtype"]]
    # only active requests read q, k, v, a and a state, and write one
    per_active = (2 * hq * dk + hv * dv + hv * dk + hv) * x + 2 * hv * dv * dk * s
    return _active(problem) * per_active + batch * (4 + hv * dv * x) + hv * 4 + hv * dk * 4
