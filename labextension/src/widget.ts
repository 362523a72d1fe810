import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Kernel } from '@jupyterlab/services';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  IGpu,
  IGpuProcesses,
  IMetrics,
  INotebookMemory,
  IRun,
  MetricsPoll,
  PollState
} from './model';
import { IVersionInfo, requestAPI } from './request';

const GiB = 1024 ** 3;

/** Create an element with text content (never HTML: GPU names and paths come from outside). */
function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function bar(label: string, fraction: number, text: string): HTMLElement {
  const row = el('div', 'jp-TrainmatePanel-bar');
  row.append(el('span', 'jp-TrainmatePanel-barLabel', label));
  const track = el('div', 'jp-TrainmatePanel-barTrack');
  const fill = el('div', 'jp-TrainmatePanel-barFill');
  fill.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
  track.append(fill);
  row.append(track, el('span', 'jp-TrainmatePanel-barText', text));
  return row;
}

function sparkline(values: number[]): SVGSVGElement {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'jp-TrainmatePanel-sparkline');
  svg.setAttribute('viewBox', '0 0 100 20');
  svg.setAttribute('preserveAspectRatio', 'none');
  const line = document.createElementNS(ns, 'polyline');
  const step = values.length > 1 ? 100 / (values.length - 1) : 100;
  line.setAttribute(
    'points',
    values.map((v, i) => `${(i * step).toFixed(1)},${(20 - (v / 100) * 20).toFixed(1)}`).join(' ')
  );
  svg.append(line);
  return svg;
}

export function gib(bytes: number | null): string {
  return bytes === null ? '? GiB' : `${(bytes / GiB).toFixed(1)} GiB`;
}

function basename(path: string): string {
  return path.split('/').pop() ?? path;
}

/** What the GPU-memory actions do, and the words their dialog and button use. */
type KernelAction = 'interrupt' | 'restart' | 'shutdown';
const ACTIONS: { [K in KernelAction]: { label: string; verb: string; warn: boolean } } = {
  interrupt: { label: 'Interrupt', verb: 'Interrupt', warn: false },
  restart: { label: 'Restart', verb: 'Restart', warn: true },
  shutdown: { label: 'Shut down', verb: 'Shut down', warn: true }
};

export function duration(seconds: number): string {
  const s = Math.round(seconds);
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m ${s % 60}s`;
  }
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

/**
 * The trainmate sidebar panel: one card per GPU (utilisation and memory bars, a utilisation
 * sparkline, temperature, power), the host's CPU and memory, and the `%%train` runs in progress.
 * Polls only while shown; a server error is shown as a state, with the last good data kept.
 */
export class TrainmatePanel extends Widget {
  constructor(
    private readonly openNotebook: (path: string) => void,
    private readonly kernels: Kernel.IManager
  ) {
    super();
    this.id = 'jupyter-trainmate-panel';
    this.addClass('jp-TrainmatePanel');
    this.title.caption = 'Trainmate';
    const heading = el('h2', '', 'Trainmate');
    this._version = el('div', 'jp-TrainmatePanel-version', 'Connecting to the server extension…');
    this._status = el('div', 'jp-TrainmatePanel-status', 'Loading metrics…');
    this._body = el('div', 'jp-TrainmatePanel-body');
    this.node.append(heading, this._version, this._status, this._body);
    this.poller = new MetricsPoll(
      state => this._render(state),
      () => this.isVisible
    );
  }

  readonly poller: MetricsPoll;

  /** Ask the server for its version; show an error state instead of a blank panel on failure. */
  async refreshVersion(): Promise<void> {
    try {
      const info = await requestAPI<IVersionInfo>('version');
      this._version.textContent = `${info.name} ${info.version}`;
      this._version.dataset.state = 'ok';
    } catch (error) {
      this._version.textContent = `Server extension unavailable: ${String(error)}`;
      this._version.dataset.state = 'error';
    }
  }

  protected onAfterShow(_msg: Message): void {
    void this.refreshVersion();
    this.poller.refresh();
  }

  dispose(): void {
    this.poller.dispose();
    super.dispose();
  }

  /**
   * Interrupt, restart or shut down a kernel holding GPU memory, after a confirmation, through
   * Jupyter's own kernel API (the open notebook sees the change as if done from its toolbar).
   */
  async kernelAction(action: KernelAction, notebook: INotebookMemory): Promise<void> {
    const what = notebook.path ?? `kernel ${notebook.kernel_id}`;
    const { label, verb, warn } = ACTIONS[action];
    const busy = notebook.execution_state === 'busy' ? ' It is running code right now.' : '';
    const frees =
      action === 'interrupt'
        ? 'The running cell stops; the kernel keeps its variables and its GPU memory.'
        : `Its variables are lost and its ${gib(notebook.used_bytes)} of GPU memory freed.`;
    const result = await showDialog({
      title: `${verb} the kernel of ${basename(what)}?`,
      body: `${what} (${notebook.kernel_name}).${busy} ${frees}`,
      buttons: [
        Dialog.cancelButton(),
        warn ? Dialog.warnButton({ label }) : Dialog.okButton({ label })
      ]
    });
    if (!result.button.accept) {
      return;
    }
    try {
      if (action === 'shutdown') {
        await this.kernels.shutdown(notebook.kernel_id);
      } else {
        const connection = this.kernels.connectTo({
          model: { id: notebook.kernel_id, name: notebook.kernel_name }
        });
        try {
          await (action === 'interrupt' ? connection.interrupt() : connection.restart());
        } finally {
          connection.dispose();
        }
      }
    } catch (error) {
      await showDialog({
        title: `${verb} failed`,
        body: String(error),
        buttons: [Dialog.okButton()]
      });
    }
    this.poller.refresh();
  }

  private _render(state: PollState): void {
    if (state.kind === 'error') {
      this._status.textContent = `Metrics unavailable: ${state.message} (retrying in ${state.retryInS}s)`;
      this._status.dataset.state = 'error';
      return;
    }
    if (state.kind === 'loading') {
      return;
    }
    const m = state.data.metrics;
    this._status.dataset.state = 'ok';
    this._status.textContent = m.gpu.available
      ? `${m.gpu.gpus.length} GPU(s), driver ${m.gpu.driver_version}${m.gpu.source === 'fake' ? ' (fake GPU source)' : ''}`
      : `No GPU data: ${m.gpu.reason}`;
    const body: HTMLElement[] = m.gpu.gpus.map(gpu => this._gpuCard(gpu));
    if (state.data.processes.available) {
      body.push(this._gpuMemory(state.data.processes)); // no GPU: the status line says why
    }
    body.push(this._hostCard(m));
    body.push(this._runs(m.runs));
    this._body.replaceChildren(...body);
  }

  private _gpuCard(gpu: IGpu): HTMLElement {
    const card = el('div', 'jp-TrainmatePanel-card jp-TrainmatePanel-gpu');
    card.append(el('div', 'jp-TrainmatePanel-cardTitle', `GPU ${gpu.index}: ${gpu.name}`));
    const util = gpu.utilization_pct;
    card.append(bar('util', (util ?? 0) / 100, util === null ? 'n/a' : `${util.toFixed(0)}%`));
    card.append(
      bar(
        'mem',
        gpu.memory_used_bytes / Math.max(1, gpu.memory_total_bytes),
        `${(gpu.memory_used_bytes / GiB).toFixed(1)} / ${(gpu.memory_total_bytes / GiB).toFixed(1)} GiB`
      )
    );
    card.append(sparkline(this.poller.history.get(gpu.uuid) ?? []));
    const facts: string[] = [];
    if (gpu.temperature_c !== null) {
      facts.push(`${gpu.temperature_c.toFixed(0)} °C`);
    }
    if (gpu.power_w !== null) {
      facts.push(
        `${gpu.power_w.toFixed(0)} W` + (gpu.power_limit_w !== null ? ` / ${gpu.power_limit_w.toFixed(0)} W` : '')
      );
    }
    for (const mig of gpu.mig) {
      facts.push(`MIG ${mig.index} ${mig.name}: ${(mig.memory_used_bytes / GiB).toFixed(1)} GiB`);
    }
    card.append(el('div', 'jp-TrainmatePanel-facts', facts.join(' · ')));
    return card;
  }

  /** GPU memory by notebook: this server's kernels holding memory, then the other processes. */
  private _gpuMemory(found: IGpuProcesses): HTMLElement {
    const section = el('div', 'jp-TrainmatePanel-card jp-TrainmatePanel-memory');
    section.append(el('div', 'jp-TrainmatePanel-cardTitle', 'GPU memory by notebook'));
    if (found.notebooks.length === 0) {
      section.append(el('div', 'jp-TrainmatePanel-empty', 'No kernel of this server holds GPU memory'));
    }
    const now = Date.now() / 1000;
    for (const notebook of found.notebooks) {
      const row = el('div', 'jp-TrainmatePanel-holder');
      row.dataset.kernelId = notebook.kernel_id;
      row.dataset.state = notebook.execution_state;
      const path = notebook.path;
      const name = el(
        'div',
        'jp-TrainmatePanel-holderName',
        path ? basename(path) : `${notebook.kernel_name} kernel ${notebook.kernel_id.slice(0, 8)}`
      );
      if (path) {
        name.classList.add('jp-mod-openable');
        name.title = `Open ${path}`;
        name.addEventListener('click', () => this.openNotebook(path));
      }
      row.append(name);
      const perGpu =
        found.gpus.length > 1
          ? ' (' + notebook.gpus.map(g => `GPU ${g.gpu}: ${gib(g.used_bytes)}`).join(', ') + ')'
          : '';
      const since =
        notebook.last_activity !== null
          ? ` for ${duration(Math.max(0, now - notebook.last_activity))}`
          : '';
      row.append(
        el(
          'div',
          'jp-TrainmatePanel-holderStats',
          `${gib(notebook.used_bytes)}${perGpu} · ${notebook.execution_state}${since}`
        )
      );
      const actions = el('div', 'jp-TrainmatePanel-holderActions');
      for (const action of ['interrupt', 'restart', 'shutdown'] as KernelAction[]) {
        const button = el('button', 'jp-TrainmatePanel-action', ACTIONS[action].label);
        button.dataset.action = action;
        button.disabled = action === 'interrupt' && notebook.execution_state !== 'busy';
        button.title = `${ACTIONS[action].verb} this kernel (asks first)`;
        button.addEventListener('click', () => void this.kernelAction(action, notebook));
        actions.append(button);
      }
      row.append(actions);
      section.append(row);
    }
    if (found.others.length > 0) {
      section.append(el('div', 'jp-TrainmatePanel-subtitle', 'Other processes'));
      for (const other of found.others) {
        const row = el(
          'div',
          'jp-TrainmatePanel-other',
          `pid ${other.pid} · GPU ${other.gpu} · ${gib(other.used_bytes)} · ${other.command}`
        );
        row.title = other.command;
        row.dataset.pid = String(other.pid);
        section.append(row);
      }
    }
    return section;
  }

  private _hostCard(m: IMetrics): HTMLElement {
    const card = el('div', 'jp-TrainmatePanel-card jp-TrainmatePanel-host');
    const limit = m.host.limited_by_cgroup ? ' (container limit)' : '';
    card.append(el('div', 'jp-TrainmatePanel-cardTitle', `Host: ${m.host.cpus} CPUs${limit}`));
    card.append(bar('CPU', m.host.cpu_percent / 100, `${m.host.cpu_percent.toFixed(0)}%`));
    card.append(
      bar(
        'RAM',
        m.host.memory_used_bytes / Math.max(1, m.host.memory_total_bytes),
        `${(m.host.memory_used_bytes / GiB).toFixed(1)} / ${(m.host.memory_total_bytes / GiB).toFixed(1)} GiB`
      )
    );
    return card;
  }

  private _runs(runs: IRun[]): HTMLElement {
    const section = el('div', 'jp-TrainmatePanel-runs');
    section.append(el('div', 'jp-TrainmatePanel-cardTitle', `Runs in progress (${runs.length})`));
    if (runs.length === 0) {
      section.append(el('div', 'jp-TrainmatePanel-empty', 'No %%train run in progress'));
    }
    for (const run of runs) {
      const item = el('div', 'jp-TrainmatePanel-run');
      item.dataset.pid = String(run.pid);
      const where = run.notebook ? run.notebook.split('/').pop() ?? run.notebook : `pid ${run.pid}`;
      item.append(el('div', 'jp-TrainmatePanel-runTitle', `${where}: ${run.run_name}`));
      const epochs = run.epochs_total ? `epoch ${run.epoch}/${run.epochs_total}` : `epoch ${run.epoch}`;
      const progress = run.fraction !== null ? `${(run.fraction * 100).toFixed(0)}%` : `${run.steps} steps`;
      const eta = run.eta_s !== null ? `, ETA ${duration(run.eta_s)}` : '';
      item.append(el('div', 'jp-TrainmatePanel-runProgress', `${progress}, ${epochs}${eta}`));
      if (run.fraction !== null) {
        item.append(bar('', run.fraction, ''));
      }
      const loss = run.last_loss !== null ? `, loss ${run.last_loss.toPrecision(4)}` : '';
      item.append(
        el(
          'div',
          'jp-TrainmatePanel-runStats',
          `${run.samples_per_s.toFixed(0)} samples/s, data wait ${(run.data_wait_share * 100).toFixed(0)}%${loss} · ${run.device}`
        )
      );
      const path = run.path;
      if (path) {
        item.classList.add('jp-mod-openable');
        item.title = `Open ${path}`;
        item.addEventListener('click', () => this.openNotebook(path));
      }
      section.append(item);
    }
    return section;
  }

  private _version: HTMLDivElement;
  private _status: HTMLDivElement;
  private _body: HTMLDivElement;
}
