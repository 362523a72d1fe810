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

/** Samples of GPU utilisation kept for each card's sparkline. */
export const HISTORY = 60;

export type PollState =
  | { kind: 'loading' }
  | { kind: 'ok'; metrics: IMetrics }
  | { kind: 'error'; message: string; retryInS: number; last: IMetrics | null };

/**
 * Polls the metrics endpoint: every `intervalMs` while visible, backing off (doubling, up to
 * `maxIntervalMs`) after errors, and not at all while paused (the panel is hidden). Plain HTTP
 * polling on purpose: WebSockets break behind some proxies.
 */
export class MetricsPoller {
  constructor(
    private readonly onChange: (state: PollState) => void,
    private readonly intervalMs = 2000,
    private readonly maxIntervalMs = 30000
  ) {}

  readonly history = new Map<string, number[]>();

  get running(): boolean {
    return this._running;
  }

  start(): void {
    if (this._running) {
      return;
    }
    this._running = true;
    void this._tick();
  }

  pause(): void {
    this._running = false;
    if (this._timer !== undefined) {
      window.clearTimeout(this._timer);
      this._timer = undefined;
    }
  }

  private async _tick(): Promise<void> {
    this._timer = undefined;
    if (!this._running) {
      return;
    }
    let delay = this.intervalMs;
    try {
      const metrics = await requestAPI<IMetrics>('metrics');
      this._failures = 0;
      this._last = metrics;
      this._remember(metrics);
      this.onChange({ kind: 'ok', metrics });
    } catch (error) {
      this._failures += 1;
      delay = Math.min(this.maxIntervalMs, this.intervalMs * 2 ** this._failures);
      this.onChange({
        kind: 'error',
        message: error instanceof Error ? error.message : String(error),
        retryInS: Math.round(delay / 1000),
        last: this._last
      });
    }
    if (this._running) {
      this._timer = window.setTimeout(() => void this._tick(), delay);
    }
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

  private _running = false;
  private _failures = 0;
  private _timer: number | undefined = undefined;
  private _last: IMetrics | null = null;
}
