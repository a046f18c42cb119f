// The tools of the `{{name}}` plugin: a Capstan plugin in JavaScript.
//
// Build: capstan plugins build (or npm ci, then npm run build; makes {{name}}.wasm).

import { Toolbox, ToolError, readText } from './capstan.js';

const toolbox = new Toolbox();

toolbox.tool(
  {
    name: '{{tool}}',
    description: 'Counts the lines and words of a workspace file and lists its most frequent words.',
    needs: ['fs.read'],
    args: {
      path: { type: 'string', description: 'a file, relative to the workspace root' },
      top: { type: 'integer', description: 'how many of the most frequent words to list', optional: true },
    },
  },
  ({ path, top = 5 }) => {
    if (top < 0) throw ToolError.invalidArgs('`top` must be 0 or more');
    const text = readText(path);
    const counts = new Map();
    for (const word of text.toLowerCase().split(/\s+/).filter(Boolean)) {
      counts.set(word, (counts.get(word) ?? 0) + 1);
    }
    const frequent = [...counts].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).slice(0, top);
    const words = [...counts.values()].reduce((sum, n) => sum + n, 0);
    return { lines: text.split('\n').filter((line, i, all) => i < all.length - 1 || line).length, words, top: frequent };
  },
);

export const tool = toolbox.export();
