import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The server extension's REST namespace, under the server's base URL. */
export const API_NAMESPACE = 'trainmate/api';

/** Answer of `GET /trainmate/api/version`. */
export interface IVersionInfo {
  name: string;
  version: string;
}

/**
 * Call an endpoint of the jupyter_trainmate server extension and parse its JSON.
 *
 * Uses the server's own settings, so the token, XSRF cookie and base URL are handled the same
 * way as every other JupyterLab request.
 */
export async function requestAPI<T>(
  endPoint: string,
  init: RequestInit = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, API_NAMESPACE, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response, text);
  }
  return JSON.parse(text) as T;
}
