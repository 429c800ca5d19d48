// What the browser's machine is, in the JSON shape of the native
// `hearth info --platform --json` (`cpu`, `memory`, `gpus`, `defaults`),
// beside the package's own flags. Read from what the browser reports
// (WebAssembly.validate, navigator.gpu's features and limits), never from
// an adapter's name: the name is kept for people to read.

import type {
  BackendChoice, Capabilities, CpuInfo, GpuInfo, MemoryInfo, PlatformDefaults,
} from './types.js';

/** The parts of a GPUAdapter read here (`info` from Chrome 114 on). */
export interface AdapterLike {
  info?: {
    vendor?: string; architecture?: string; description?: string; isFallbackAdapter?: boolean;
    subgroupMinSize?: number; subgroupMaxSize?: number;
  };
  isFallbackAdapter?: boolean;
  features?: { has(name: string): boolean };
  limits?: Record<string, number | undefined>;
}

interface GpuLike {
  requestAdapter(): Promise<AdapterLike | null>;
  wgslLanguageFeatures?: { has(name: string): boolean };
}

/** Threads the CPU path runs on at most (more cores rarely help decode). */
export const MAX_THREADS = 8;

/** `(module (func (result v128) i32.const 0 i8x16.splat i8x16.popcnt))`:
 * validates exactly where the engine runs wasm SIMD128. */
const SIMD128_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 10, 1, 8, 0, 65, 0, 253, 15, 253, 98, 11,
]);

function wasmSimd128(): boolean {
  try {
    return typeof WebAssembly !== 'undefined' && WebAssembly.validate(SIMD128_PROBE);
  } catch {
    return false;
  }
}

function cpuInfo(cores: number, threads: boolean): CpuInfo {
  const tiers = wasmSimd128() ? ['scalar', 'simd128'] : ['scalar'];
  return {
    arch: 'wasm32',
    isa_tiers: tiers,
    best_isa: tiers[tiers.length - 1] ?? 'scalar',
    logical_cores: cores,
    threads,
  };
}

function memoryInfo(nav: Navigator): MemoryInfo {
  // navigator.deviceMemory: GiB, rounded and capped by the browser (Chromium only).
  const gib = (nav as Navigator & { deviceMemory?: number }).deviceMemory;
  return {
    total_bytes: typeof gib === 'number' && gib > 0 ? Math.round(gib * 2 ** 30) : null,
    available_bytes: null,
    read_gbps: null,
  };
}

/** The adapter as the native `GpuInfo`: WebGPU reports no memory, no
 * driver and no device type beyond `isFallbackAdapter`. */
export function gpuInfo(adapter: AdapterLike, int8Dot: boolean): GpuInfo {
  const info = adapter.info;
  const has = (f: string) => adapter.features?.has(f) ?? false;
  const limit = (k: string) => adapter.limits?.[k] ?? 0;
  const subgroups = has('subgroups');
  const fallback = !!(info?.isFallbackAdapter ?? adapter.isFallbackAdapter);
  return {
    backend: 'webgpu',
    index: 0,
    name: info?.description || [info?.vendor, info?.architecture].filter(Boolean).join(' ') || 'unnamed adapter',
    api: 'BrowserWebGpu',
    device_type: fallback ? 'cpu' : 'other',
    driver: null,
    compute_capability: null,
    memory_bytes: null,
    free_memory_bytes: null,
    limits: {
      max_buffer_bytes: limit('maxBufferSize'),
      max_storage_binding_bytes: limit('maxStorageBufferBindingSize'),
      max_workgroup_storage_bytes: limit('maxComputeWorkgroupStorageSize'),
      max_workgroup_invocations: limit('maxComputeInvocationsPerWorkgroup'),
    },
    features: {
      f16: has('shader-f16'),
      subgroups,
      subgroup_min_size: subgroups ? info?.subgroupMinSize ?? 0 : 0,
      subgroup_max_size: subgroups ? info?.subgroupMaxSize ?? 0 : 0,
      int8_dot: int8Dot,
      matrix_units: has('chromium-experimental-subgroup-matrix'),
      timestamp_queries: has('timestamp-query'),
    },
  };
}

/** The package's choices from the platform, with why (as the native
 * `Defaults`; `backend` is what `backend: 'auto'` asks the worker for). */
function defaults(cpu: CpuInfo, gpus: GpuInfo[]): PlatformDefaults {
  const hardware = gpus.find((g) => g.device_type !== 'cpu');
  const backend: BackendChoice = hardware
    ? { value: 'webgpu', why: 'a hardware WebGPU adapter (the CPU path where the model does not fit it)' }
    : {
      value: 'cpu',
      why: gpus.length > 0
        ? 'the only WebGPU adapter is a software one, slower than the CPU path'
        : 'no WebGPU adapter',
    };
  const n = cpu.threads ? Math.max(1, Math.min(cpu.logical_cores, MAX_THREADS)) : 1;
  const threads = cpu.threads
    ? { value: n, why: `one per logical core (${cpu.logical_cores}), at most ${MAX_THREADS}` }
    : { value: 1, why: 'no worker threads: the page is not cross-origin isolated (COOP/COEP headers)' };
  return {
    backend,
    threads,
    kv_type: { value: 'f16', why: 'half the memory of f32' },
    kernels: cpu.best_isa === 'simd128'
      ? { value: 'simd128', why: 'wasm SIMD128 int8 dots over 4-row bands' }
      : { value: 'scalar', why: 'this engine has no wasm SIMD128: portable scalar kernels' },
  };
}

/** What the browser offers: the platform (`cpu`, `memory`, `gpus`,
 * `defaults`) and the package's flags (threads, WebGPU, storage). */
export async function capabilities(): Promise<Capabilities> {
  const nav = globalThis.navigator as Navigator & { gpu?: GpuLike };
  let adapter: AdapterLike | null = null;
  try {
    adapter = nav.gpu ? await nav.gpu.requestAdapter() : null;
  } catch {
    adapter = null;
  }
  const threads = globalThis.crossOriginIsolated === true && typeof SharedArrayBuffer !== 'undefined';
  const cores = nav.hardwareConcurrency ?? 1;
  const cpu = cpuInfo(cores, threads);
  const int8Dot = nav.gpu?.wgslLanguageFeatures?.has('packed_4x8_integer_dot_product') ?? false;
  const gpus = adapter ? [gpuInfo(adapter, int8Dot)] : [];
  const gpu = gpus[0];
  return {
    cpu,
    memory: memoryInfo(nav),
    gpus,
    defaults: defaults(cpu, gpus),
    threads,
    hardwareConcurrency: cores,
    webgpu: adapter !== null,
    webgpuAdapter: gpu?.name ?? null,
    webgpuFallback: gpu?.device_type === 'cpu',
    webgpuBackend: true,
    opfs: typeof nav.storage?.getDirectory === 'function',
    cacheStorage: typeof globalThis.caches !== 'undefined',
  };
}
