import { Widget } from '@lumino/widgets';

import { IVersionInfo, requestAPI } from './request';

/**
 * The trainmate sidebar panel.
 *
 * For now it shows the package version reported by the server extension (which proves the
 * server side is installed and enabled) and that no GPU data is available yet. Everything the
 * server sends is inserted with `textContent`, never as HTML.
 */
export class TrainmatePanel extends Widget {
  constructor() {
    super();
    this.id = 'jupyter-trainmate-panel';
    this.addClass('jp-TrainmatePanel');
    this.title.caption = 'Trainmate';

    const heading = document.createElement('h2');
    heading.textContent = 'Trainmate';
    this._version = document.createElement('div');
    this._version.className = 'jp-TrainmatePanel-version';
    this._version.textContent = 'Connecting to the server extension…';
    this._status = document.createElement('div');
    this._status.className = 'jp-TrainmatePanel-status';
    this._status.textContent = 'No GPU data yet';
    this.node.append(heading, this._version, this._status);
  }

  /** Ask the server for its version; show an error state instead of a blank panel on failure. */
  async refresh(): Promise<void> {
    try {
      const info = await requestAPI<IVersionInfo>('version');
      this._version.textContent = `${info.name} ${info.version}`;
      this._version.dataset.state = 'ok';
    } catch (error) {
      this._version.textContent = `Server extension unavailable: ${String(error)}`;
      this._version.dataset.state = 'error';
    }
  }

  protected onAfterShow(): void {
    void this.refresh();
  }

  private _version: HTMLDivElement;
  private _status: HTMLDivElement;
}
