import { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';

import { IEndedRun } from './model';
import { requestAPI } from './request';
import { duration } from './widget';

/** The settings of the notifications plugin (schema/notifications.json). */
export interface INotifySettings {
  enabled: boolean;
  threshold: number;
  systemNotifications: boolean;
  autoClose: number;
  pollInterval: number;
}

export const DEFAULT_NOTIFY_SETTINGS: INotifySettings = {
  enabled: true,
  threshold: 60,
  systemNotifications: false,
  autoClose: 15000,
  pollInterval: 5000
};

const TOAST_TYPE: { [outcome: string]: Notification.TypeOptions } = {
  finished: 'success',
  'stopped early': 'info',
  interrupted: 'warning',
  failed: 'error'
};

/** What the notebook panel offers that opening at a cell needs (no @jupyterlab/notebook import). */
interface INotebookLike {
  context: { ready: Promise<void> };
  content: {
    widgets: ReadonlyArray<{ model: { id: string } }>;
    activeCellIndex: number;
    scrollToItem?: (index: number) => Promise<void>;
  };
}

function isNotebookLike(widget: unknown): widget is INotebookLike {
  const w = widget as Partial<INotebookLike> | null | undefined;
  return !!w && !!w.context && !!w.content && Array.isArray(w.content.widgets);
}

/** The toast's text: notebook, outcome, duration, final metrics (JupyterLab keeps 140 chars). */
export function describe(run: IEndedRun): string {
  const where = run.notebook ? run.notebook.split('/').pop() ?? run.notebook : `pid ${run.pid}`;
  const what = run.sweep ? `sweep ${run.sweep.study}` : '%%train';
  const parts = [`${where}: ${what} ${run.outcome} after ${duration(run.wall_s)}`];
  if (run.sweep) {
    parts.push(`${run.sweep.trials} trial(s)`);
  }
  if (run.last_loss !== null && !('loss' in run.metrics)) {
    parts.push(`loss ${run.last_loss.toPrecision(4)}`);
  }
  for (const [name, value] of Object.entries(run.metrics)) {
    parts.push(`${name} ${Number(value).toPrecision(4)}`);
  }
  return parts.join(' · ');
}

/**
 * Toasts when a `%%train` run ends, from the ended runs the server lists: it works whatever the
 * notebook's tab does (in the background, closed) while a lab window is open. Runs that had
 * ended before this window first asked are not announced again.
 */
export class RunNotifier {
  constructor(private readonly app: JupyterFrontEnd) {
    this.poll = new Poll<void, unknown>({
      auto: false,
      name: 'jupyter-trainmate:notifications',
      factory: () => this._check(),
      frequency: { interval: DEFAULT_NOTIFY_SETTINGS.pollInterval, backoff: true, max: 60000 },
      standby: 'never' // a hidden browser tab is when a system notification matters most
    });
  }

  readonly poll: Poll<void, unknown>;

  get settings(): INotifySettings {
    return this._settings;
  }

  set settings(settings: INotifySettings) {
    const wasEnabled = this._settings.enabled;
    this._settings = settings;
    this.poll.frequency = { interval: settings.pollInterval, backoff: true, max: 60000 };
    if (settings.systemNotifications && 'Notification' in window) {
      if (window.Notification.permission === 'default') {
        void window.Notification.requestPermission();
      }
    }
    if (!settings.enabled) {
      void this.poll.stop();
    } else if (!wasEnabled || this.poll.state.phase === 'constructed') {
      this._baseline = true; // what ended while switched off is not announced
      void this.poll.start();
    }
  }

  /** Open the run's notebook, at the cell that ran when the kernel said which. */
  async open(run: IEndedRun): Promise<void> {
    if (!run.path) {
      return;
    }
    const widget: unknown = await this.app.commands.execute('docmanager:open', {
      path: run.path
    });
    if (!run.cell_id || !isNotebookLike(widget)) {
      return;
    }
    await widget.context.ready;
    const index = widget.content.widgets.findIndex(cell => cell.model.id === run.cell_id);
    if (index >= 0) {
      widget.content.activeCellIndex = index;
      await widget.content.scrollToItem?.(index);
    }
  }

  private async _check(): Promise<void> {
    const { ended } = await requestAPI<{ ended: IEndedRun[] }>('ended');
    const fresh = ended.filter(run => !this._seen.has(run.id));
    for (const run of fresh) {
      this._seen.add(run.id);
    }
    if (this._baseline) {
      this._baseline = false;
      return;
    }
    for (const run of fresh) {
      const threshold = run.notify_after ?? this._settings.threshold;
      if (this._settings.enabled && run.wall_s >= threshold) {
        this._notify(run);
      }
    }
  }

  private _notify(run: IEndedRun): void {
    const message = describe(run);
    const actions: Notification.IAction[] = [];
    if (run.path) {
      const path = run.path;
      actions.push({
        label: 'Open notebook',
        caption: run.cell_id ? `Open ${path} at the cell that ran` : `Open ${path}`,
        callback: () => void this.open(run)
      });
    }
    Notification.emit(message, TOAST_TYPE[run.outcome] ?? 'default', {
      autoClose: this._settings.autoClose,
      actions
    });
    if (
      this._settings.systemNotifications &&
      'Notification' in window &&
      window.Notification.permission === 'granted'
    ) {
      const system = new window.Notification(`%%train ${run.outcome}`, {
        body: message,
        tag: `jupyter-trainmate-${run.id}`
      });
      system.onclick = () => {
        window.focus();
        void this.open(run);
      };
    }
  }

  private _settings: INotifySettings = { ...DEFAULT_NOTIFY_SETTINGS, enabled: false };
  private _seen = new Set<string>();
  private _baseline = true;
}
