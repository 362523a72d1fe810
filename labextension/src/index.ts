import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { LabIcon } from '@jupyterlab/ui-components';

import { TrainmatePanel } from './widget';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16" height="16">' +
  '<path class="jp-icon3" fill="#616161" d="M3 20h2V10H3v10zm4 0h2V4H7v16zm4 0h2v-7h-2v7zm4 ' +
  '0h2V8h-2v12zm4 0h2v-4h-2v4z"/></svg>';

export const trainmateIcon = new LabIcon({
  name: 'jupyter-trainmate:icon',
  svgstr: ICON_SVG
});

/** Adds the trainmate panel to the right sidebar. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-trainmate:sidebar',
  description: 'GPU/host metrics and %%train runs in progress, in the sidebar.',
  autoStart: true,
  requires: [ILabShell],
  activate: (app: JupyterFrontEnd, shell: ILabShell): void => {
    const panel = new TrainmatePanel(path => {
      void app.commands.execute('docmanager:open', { path });
    });
    panel.title.icon = trainmateIcon;
    shell.add(panel, 'right', { rank: 600 });
    // Stop polling while the browser tab itself is hidden, too.
    document.addEventListener('visibilitychange', () => {
      if (document.hidden) {
        panel.poller.pause();
      } else if (panel.isVisible) {
        panel.poller.start();
      }
    });
  }
};

export default plugin;
