// A module worker for the workerd test: runs a recovering fetch against the
// provider URL given in the query and answers a JSON summary.
import { createRecoveringFetch } from './pkg/all/workerd.mjs';

export default {
  async fetch(request) {
    const params = new URL(request.url).searchParams;
    const upstream = params.get('upstream');
    const events = [];
    const rfetch = createRecoveringFetch({ backoffBaseMs: 1, backoffCeilingMs: 2, maxAttempts: 2, onEvent: (e) => events.push(e.event) });
    try {
      const res = await rfetch(upstream, { method: 'POST', body: '{}' });
      const text = await res.text();
      return Response.json({ status: res.status, text, events, report: res.recovery.report() });
    } catch (e) {
      return Response.json({ error: e.name, outcome: e.outcome, report: e.report, events });
    }
  },
};
