import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { DEFAULT_INTERVAL_MS } from './model';
import { DEFAULT_NOTIFY_SETTINGS, INotifySettings, RunNotifier } from './notifications';
import { TrainmatePanel } from './widget';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16" height="16">' +
  '<path class="jp-icon3" fill="#616161" d="M3 20h2V10H3v10zm4 0h2V4H7v16zm4 0h2v-7h-2v7zm4 ' +
  '0h2V8h-2v12zm4 0h2v-4h-2v4z"/></svg>';

export const trainmateIcon = new LabIcon({
  name: 'jupyter-trainmate:icon',
  svgstr: ICON_SVG
});

const SIDEBAR_ID = 'jupyter-trainmate:sidebar';
const NOTIFICATIONS_ID = 'jupyter-trainmate:notifications';

/** Adds the trainmate panel to the right sidebar; its refresh interval is a setting. */
const sidebar: JupyterFrontEndPlugin<void> = {
  id: SIDEBAR_ID,
  description: 'GPU/host metrics, GPU memory by notebook and %%train runs in progress, in the sidebar.',
  autoStart: true,
  requires: [ILabShell],
  optional: [ISettingRegistry],
  activate: (app: JupyterFrontEnd, shell: ILabShell, registry: ISettingRegistry | null): void => {
    const panel = new TrainmatePanel(path => {
      void app.commands.execute('docmanager:open', { path });
    }, app.serviceManager.kernels);
    panel.title.icon = trainmateIcon;
    shell.add(panel, 'right', { rank: 600 });
    panel.poller.interval = DEFAULT_INTERVAL_MS;
    if (registry) {
      void registry.load(SIDEBAR_ID).then(settings => {
        const apply = (): void => {
          panel.poller.interval = settings.get('refreshInterval').composite as number;
        };
        apply();
        settings.changed.connect(apply);
      });
    }
  }
};

/** Toasts (and system notifications) when a %%train run ends; the settings say when. */
const notifications: JupyterFrontEndPlugin<void> = {
  id: NOTIFICATIONS_ID,
  description: 'A notification when a %%train run ends, from the run status the server lists.',
  autoStart: true,
  optional: [ISettingRegistry],
  activate: (app: JupyterFrontEnd, registry: ISettingRegistry | null): void => {
    const notifier = new RunNotifier(app);
    if (!registry) {
      notifier.settings = DEFAULT_NOTIFY_SETTINGS;
      return;
    }
    void registry
      .load(NOTIFICATIONS_ID)
      .then(settings => {
        const apply = (): void => {
          notifier.settings = {
            ...DEFAULT_NOTIFY_SETTINGS,
            ...(settings.composite as Partial<INotifySettings>)
          };
        };
        apply();
        settings.changed.connect(apply);
      })
      .catch(() => {
        notifier.settings = DEFAULT_NOTIFY_SETTINGS;
      });
  }
};

export default [sidebar, notifications];
