import { Poll } from '@lumino/polling';

import { requestAPI } from './request';

/** One GPU as `GET /trainmate/api/metrics` reports it (null: not reported by the driver). */
export interface IGpu {
  index: number;
  name: string;
  uuid: string;
  utilization_pct: number | null;
  memory_used_bytes: number;
  memory_total_bytes: number;
  temperature_c: number | null;
  power_w: number | null;
  power_limit_w: number | null;
  mig: { index: number; name: string; memory_used_bytes: number; memory_total_bytes: number }[];
}

export interface IRun {
  pid: number;
  notebook: string | null;
  path: string | null;
  run_name: string;
  started: number;
  updated: number;
  steps: number;
  epoch: number;
  epochs_total: number | null;
  fraction: number | null;
  eta_s: number | null;
  samples_per_s: number;
  data_wait_share: number;
  last_loss: number | null;
  device: string;
}

export interface IMetrics {
  time: number;
  gpu: {
    available: boolean;
    source: string;
    reason: string;
    driver_version: string;
    gpus: IGpu[];
  };
  host: {
    cpu_percent: number;
    cpus: number;
    memory_used_bytes: number;
    memory_total_bytes: number;
    limited_by_cgroup: boolean;
  };
  runs: IRun[];
}

/** A `%%train` run that ended lately (the server keeps them ten minutes). */
export interface IEndedRun {
  id: string;
  pid: number;
  notebook: string | null;
  path: string | null;
  cell_id: string | null;
  run_name: string;
  notify_after: number | null;
  outcome: 'finished' | 'stopped early' | 'failed' | 'interrupted';
  started: number;
  ended: number;
  wall_s: number;
  steps: number;
  epochs: number;
  metrics: { [name: string]: number };
  last_loss: number | null;
  /** A sweep's one notice (its trials raise none): its study and trials run. */
  sweep?: { study: string; trials: number };
}

/** One kernel of this server holding GPU memory (`GET /trainmate/api/gpu-processes`). */
export interface INotebookMemory {
  kernel_id: string;
  kernel_name: string;
  path: string | null;
  execution_state: string;
  last_activity: number | null;
  used_bytes: number | null;
  gpus: { gpu: number; used_bytes: number | null }[];
  pids: number[];
}

export interface IGpuProcesses {
  available: boolean;
  source: string;
  reason: string;
  gpus: { index: number; name: string; memory_used_bytes: number; memory_total_bytes: number }[];
  notebooks: INotebookMemory[];
  others: { gpu: number; pid: number; used_bytes: number | null; command: string }[];
}

/** Samples of GPU utilisation kept for each card's sparkline. */
export const HISTORY = 60;

/** What the panel draws from: both answers of one poll tick. */
export interface IPanelData {
  metrics: IMetrics;
  processes: IGpuProcesses;
}

export type PollState =
  | { kind: 'loading' }
  | { kind: 'ok'; data: IPanelData }
  | { kind: 'error'; message: string; retryInS: number; last: IPanelData | null };

/** Polling defaults; the interval is the `refreshInterval` setting of the sidebar plugin. */
export const DEFAULT_INTERVAL_MS = 2000;
export const MAX_INTERVAL_MS = 30000;

/**
 * Polls the metrics and GPU-process endpoints with Lumino's `Poll`: every `interval` ms while
 * the panel is shown and the browser tab visible (standby otherwise), with backoff after errors
 * up to `MAX_INTERVAL_MS`. Plain HTTP polling on purpose: WebSockets break behind some proxies.
 */
export class MetricsPoll {
  constructor(
    private readonly onChange: (state: PollState) => void,
    shown: () => boolean
  ) {
    this.poll = new Poll<IPanelData, unknown>({
      auto: true,
      name: 'jupyter-trainmate:metrics',
      factory: () => this._fetch(),
      frequency: { interval: DEFAULT_INTERVAL_MS, backoff: true, max: MAX_INTERVAL_MS },
      standby: () => !shown() || 'when-hidden'
    });
    this.poll.ticked.connect((_, state) => {
      if (state.phase === 'rejected') {
        const error = state.payload;
        this.onChange({
          kind: 'error',
          message: error instanceof Error ? error.message : String(error),
          retryInS: Math.round(state.interval / 1000),
          last: this._last
        });
      }
    });
  }

  readonly poll: Poll<IPanelData, unknown>;
  readonly history = new Map<string, number[]>();

  /** The interval between two requests, in ms (the setting). */
  set interval(ms: number) {
    const interval = Math.max(500, Math.min(ms, MAX_INTERVAL_MS));
    this.poll.frequency = { interval, backoff: true, max: MAX_INTERVAL_MS };
  }

  /** Ask now (the panel was just shown, or an action changed the kernels). */
  refresh(): void {
    void this.poll.refresh();
  }

  dispose(): void {
    this.poll.dispose();
  }

  private async _fetch(): Promise<IPanelData> {
    const [metrics, processes] = await Promise.all([
      requestAPI<IMetrics>('metrics'),
      requestAPI<IGpuProcesses>('gpu-processes')
    ]);
    const data = { metrics, processes };
    this._last = data;
    this._remember(metrics);
    this.onChange({ kind: 'ok', data });
    return data;
  }

  private _remember(metrics: IMetrics): void {
    for (const gpu of metrics.gpu.gpus) {
      const series = this.history.get(gpu.uuid) ?? [];
      series.push(gpu.utilization_pct ?? 0);
      if (series.length > HISTORY) {
        series.splice(0, series.length - HISTORY);
      }
      this.history.set(gpu.uuid, series);
    }
  }

  private _last: IPanelData | null = null;
}
